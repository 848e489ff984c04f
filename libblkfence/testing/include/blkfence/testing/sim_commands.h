// Commands for the simulated target's tests (transport layer, tests only, not installed).
//
// PR IN, PR OUT and INQUIRY CDBs come from the codec's encoders, so the tests exercise the target
// with the bytes the library really sends; READ, WRITE, TEST UNIT READY, REQUEST SENSE and REPORT
// LUNS, which the codec does not encode, are built here per SBC-3 and SPC-4. Pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "blkfence/codec/inquiry.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/prout.h"
#include "blkfence/endian.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/transport/transport.h"

namespace blkfence::transport::test {

inline Command prout_command(const codec::PrOutCommand& prout) {
  Command command = Command::from_cdb(prout.cdb);
  command.direction = DataDirection::kToDevice;
  command.data_out = prout.parameters;
  return command;
}

inline Command prin_command(codec::PrInAction action, std::uint16_t allocation_length = 8192) {
  Command command = Command::from_cdb(codec::encode_prin_cdb(action, allocation_length));
  command.direction = DataDirection::kFromDevice;
  command.data_in_size = allocation_length;
  return command;
}

inline Command inquiry_command(std::optional<codec::VpdPage> page,
                               std::uint16_t allocation_length = 255) {
  Command command = Command::from_cdb(page ? codec::encode_inquiry_vpd_cdb(*page, allocation_length)
                                           : codec::encode_inquiry_cdb(allocation_length));
  command.direction = DataDirection::kFromDevice;
  command.data_in_size = allocation_length;
  return command;
}

inline Command test_unit_ready_command() {
  return Command::from_cdb(std::vector<std::uint8_t>(6, 0));
}

inline Command request_sense_command(std::uint8_t allocation_length = 252) {
  Command command =
      Command::from_cdb(std::vector<std::uint8_t>{0x03, 0, 0, 0, allocation_length, 0});
  command.direction = DataDirection::kFromDevice;
  command.data_in_size = allocation_length;
  return command;
}

inline Command report_luns_command(std::uint32_t allocation_length = 64) {
  std::vector<std::uint8_t> cdb(12, 0);
  cdb[0] = 0xa0;
  store_be32(cdb, 6, allocation_length);
  Command command = Command::from_cdb(cdb);
  command.direction = DataDirection::kFromDevice;
  command.data_in_size = allocation_length;
  return command;
}

// READ/WRITE(10), or (16) with wide: the CDB both share, LBA and block count at their offsets.
inline Command rw_command(std::uint8_t opcode10, std::uint8_t opcode16, std::uint64_t lba,
                          std::uint32_t blocks, bool wide) {
  std::vector<std::uint8_t> cdb(wide ? 16 : 10, 0);
  cdb[0] = wide ? opcode16 : opcode10;
  if (wide) {
    store_be64(cdb, 2, lba);
    store_be32(cdb, 10, blocks);
  } else {
    store_be32(cdb, 2, static_cast<std::uint32_t>(lba));
    store_be16(cdb, 7, static_cast<std::uint16_t>(blocks));
  }
  return Command::from_cdb(cdb);
}

// WRITE(10) (or WRITE(16) with wide) of blocks filled with fill.
inline Command write_command(std::uint64_t lba, std::uint8_t fill, std::uint32_t blocks = 1,
                             bool wide = false, std::uint32_t block_size = 512) {
  Command command = rw_command(0x2a, 0x8a, lba, blocks, wide);
  command.direction = DataDirection::kToDevice;
  command.data_out.assign(std::size_t{blocks} * block_size, fill);
  return command;
}

// READ(10) (or READ(16) with wide).
inline Command read_command(std::uint64_t lba, std::uint32_t blocks = 1, bool wide = false,
                            std::uint32_t block_size = 512) {
  Command command = rw_command(0x28, 0x88, lba, blocks, wide);
  command.direction = DataDirection::kFromDevice;
  command.data_in_size = blocks * block_size;
  return command;
}

// S1 (docs/protocol.md): landed writes from a nexus after a PR OUT removed its registration on that
// LU, and before it registered again.
inline std::vector<WriteRecord> s1_violations(const SimHistory& history) {
  std::vector<WriteRecord> violations;
  for (const PrOutRecord& prout : history.prouts) {
    for (const NexusId victim : prout.unregistered) {
      if (prout.nexus == victim) {
        continue;  // it unregistered itself
      }
      std::uint64_t registered_again = UINT64_MAX;
      for (const PrOutRecord& later : history.prouts) {
        if (later.lu == prout.lu && later.nexus == victim && later.sequence > prout.sequence &&
            later.outcome.status == 0 && later.sa_key != 0) {
          registered_again = std::min(registered_again, later.sequence);
        }
      }
      for (const WriteRecord& write : history.writes) {
        if (write.landed && write.lu == prout.lu && write.nexus == victim &&
            write.sequence > prout.sequence && write.sequence < registered_again) {
          violations.push_back(write);
        }
      }
    }
  }
  return violations;
}

}  // namespace blkfence::transport::test
