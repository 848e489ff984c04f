// TransportIDs: how SPC-4 names an initiator port on the wire (codec layer).
//
// They appear in PR OUT parameter lists (REGISTER with SPEC_I_PT, REGISTER AND MOVE) and in READ
// FULL STATUS descriptors. Supported: SAS (tcm_loop and vhost use it), iSCSI and Fibre Channel;
// other protocols are refused with kNotSupported. Layouts per SPC-4 7.6.4 as LIO builds and parses
// them (target_core_fabric_lib.c). Pure value type and functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "blkfence/endian.h"
#include "blkfence/error.h"

namespace blkfence::codec {

// SPC-4 7.6.1: PROTOCOL IDENTIFIER, used in TransportIDs and in VPD 0x83 designators.
enum class ProtocolId : std::uint8_t {
  kFibreChannel = 0x0,
  kParallelScsi = 0x1,
  kSsa = 0x2,
  kIeee1394 = 0x3,
  kSrp = 0x4,
  kIscsi = 0x5,
  kSas = 0x6,
  kAdt = 0x7,
  kAta = 0x8,
  kUas = 0x9,
  kSop = 0xa,
  kNone = 0xf,
};

struct TransportId {
  ProtocolId protocol = ProtocolId::kSas;
  std::uint64_t port_name = 0;  // SAS: SAS address; FC: N_Port name
  std::string iscsi_name;       // iSCSI: the initiator's iSCSI name
  std::string isid;             // iSCSI: ISID as 12 hex digits (format 01b), empty for format 00b

  friend bool operator==(const TransportId&, const TransportId&) = default;
};

inline TransportId sas_transport_id(std::uint64_t sas_address) {
  return {.protocol = ProtocolId::kSas, .port_name = sas_address, .iscsi_name = {}, .isid = {}};
}
inline TransportId fc_transport_id(std::uint64_t n_port_name) {
  return {.protocol = ProtocolId::kFibreChannel,
          .port_name = n_port_name,
          .iscsi_name = {},
          .isid = {}};
}
inline TransportId iscsi_transport_id(std::string name, std::string isid = {}) {
  return {.protocol = ProtocolId::kIscsi,
          .port_name = 0,
          .iscsi_name = std::move(name),
          .isid = std::move(isid)};
}

// Appends the TransportID to out. SAS and FC take 24 bytes; iSCSI takes 4 + the name (+ ",i,0x"
// and the ISID), NUL-terminated and padded to a multiple of 4, at least 24 bytes (SPC-4 7.6.4.6).
[[nodiscard]] Result<std::size_t> append_transport_id(std::vector<std::uint8_t>& out,
                                                      const TransportId& id);

// Decodes one TransportID that occupies exactly tid (a descriptor's ADDITIONAL DESCRIPTOR LENGTH
// says how long it is). An iSCSI ADDITIONAL LENGTH larger than tid is not trusted.
[[nodiscard]] Result<TransportId> decode_transport_id(Bytes tid);

// "sas:0x5001405aabbccdd1", "fc:0x10000000c9f3a571", "iqn.1994-05.com.redhat:node1" with
// ",i,0x<isid>" appended for format 01b.
std::string to_string(const TransportId& id);

}  // namespace blkfence::codec
