// INQUIRY (12h): CDB encoding and the VPD pages device discovery needs (codec layer).
//
// VPD 0x80 gives the unit serial number; VPD 0x83 gives the designators from which the pr layer
// takes a logical unit's WWN and groups paths (sd, sg, dm-multipath) into one LU. PAGE LENGTH is
// never trusted: designators are decoded only as far as the buffer goes, and `truncated` says the
// device claimed more. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/transport_id.h"
#include "blkfence/endian.h"
#include "blkfence/error.h"

namespace blkfence::codec {

enum class VpdPage : std::uint8_t {
  kSupportedPages = 0x00,
  kUnitSerialNumber = 0x80,
  kDeviceIdentification = 0x83,
};

// Standard INQUIRY data (EVPD=0).
Cdb6 encode_inquiry_cdb(std::uint16_t allocation_length);
// A VPD page (EVPD=1).
Cdb6 encode_inquiry_vpd_cdb(VpdPage page, std::uint16_t allocation_length);

// VPD 0x80 (SPC-4 7.8.15).
struct UnitSerial {
  std::string serial;  // PRODUCT SERIAL NUMBER without surrounding spaces and NULs (LIO adds one)
  std::uint16_t page_length = 0;
  bool truncated = false;
};

// VPD 0x83 designation descriptor fields (SPC-4 7.8.6.1).
enum class CodeSet : std::uint8_t { kBinary = 0x1, kAscii = 0x2, kUtf8 = 0x3 };
enum class Association : std::uint8_t {
  kLogicalUnit = 0x0,
  kTargetPort = 0x1,
  kTargetDevice = 0x2,
};
enum class DesignatorType : std::uint8_t {
  kVendorSpecific = 0x0,
  kT10VendorId = 0x1,
  kEui64 = 0x2,
  kNaa = 0x3,
  kRelativeTargetPort = 0x4,
  kTargetPortGroup = 0x5,
  kLogicalUnitGroup = 0x6,
  kMd5LogicalUnitId = 0x7,
  kScsiNameString = 0x8,
  kProtocolSpecificPortId = 0x9,
  kUuid = 0xa,
};

struct Designator {
  ProtocolId protocol = ProtocolId::kFibreChannel;  // meaningful only when piv
  bool piv = false;
  CodeSet code_set{};
  Association association{};
  DesignatorType type{};
  std::vector<std::uint8_t> value;  // the DESIGNATOR field
};

struct DeviceIdentification {
  std::vector<Designator> designators;  // complete descriptors only, in page order
  std::uint16_t page_length = 0;        // as the device wrote it
  bool truncated = false;
};

// kTruncated below the 4-byte header; kNotSupported when the device answered another page.
[[nodiscard]] Result<UnitSerial> decode_vpd_unit_serial(Bytes response);
[[nodiscard]] Result<DeviceIdentification> decode_vpd_device_identification(Bytes response);

// The designator as text, in the forms Linux uses for /sys/block/*/device/wwid: "naa." or "eui."
// and lower-case hex, "t10." and the ASCII text, a SCSI name string as it is ("iqn...", "naa...").
// nullopt for other types, or when the code set does not fit the type.
std::optional<std::string> designator_string(const Designator& designator);

// The logical unit's WWN: among designators associated with the LU, the first NAA, else the first
// EUI-64, else the first SCSI name string.
std::optional<std::string> lu_wwn(const DeviceIdentification& identification);

}  // namespace blkfence::codec
