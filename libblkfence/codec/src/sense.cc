// Sense data normalisation and classification (codec layer). Pure, thread-safe.
//
// SPC-4 4.5.3 fixed format: byte 0 VALID | RESPONSE CODE, byte 2 SENSE KEY, bytes 3-6 INFORMATION,
// byte 7 ADDITIONAL SENSE LENGTH, bytes 12-13 ASC/ASCQ. SPC-4 4.5.2 descriptor format: byte 1
// SENSE KEY, bytes 2-3 ASC/ASCQ, byte 7 ADDITIONAL SENSE LENGTH, then descriptors of (type, length)
// headers; type 00h carries a VALID bit and an 8-byte INFORMATION. As in sg_lib.c, ADDITIONAL
// SENSE LENGTH limits what is read, but never beyond the bytes the kernel wrote (sb_len_wr).
#include "blkfence/codec/sense.h"

#include "wire.h"

namespace blkfence::codec {
namespace {

constexpr std::size_t kHeaderSize = 8;  // up to and including ADDITIONAL SENSE LENGTH

// ASC and ASCQ, each as far as the usable bytes go.
void read_asc_ascq(Bytes usable, std::size_t offset, Sense& out) {
  if (usable.size() > offset) {
    out.asc = usable[offset];
  }
  if (usable.size() > offset + 1) {
    out.ascq = usable[offset + 1];
  } else {
    out.truncated = true;
  }
}

void decode_fixed(Bytes sense, Sense& out) {
  if (sense.size() < 3) {
    out.truncated = true;
    return;
  }
  out.sense_key = static_cast<SenseKey>(sense[2] & 0x0fU);
  // Fields beyond byte 7 count only as far as ADDITIONAL SENSE LENGTH says.
  Bytes usable = sense;
  if (sense.size() >= kHeaderSize) {
    const detail::Body body = detail::body_after(sense, kHeaderSize, sense[7]);
    usable = sense.first(kHeaderSize + body.bytes.size());
    out.truncated = out.truncated || body.truncated;
  } else {
    out.truncated = true;
  }
  if ((sense[0] & 0x80U) != 0 && usable.size() >= 7) {
    out.information = load_be32(usable, 3);
  }
  read_asc_ascq(usable, 12, out);
}

void decode_descriptor(Bytes sense, Sense& out) {
  if (sense.size() < 2) {
    out.truncated = true;
    return;
  }
  out.sense_key = static_cast<SenseKey>(sense[1] & 0x0fU);
  read_asc_ascq(sense, 2, out);
  if (sense.size() < kHeaderSize) {
    out.truncated = true;
    return;
  }
  const detail::Body body = detail::body_after(sense, kHeaderSize, sense[7]);
  out.truncated = out.truncated || body.truncated;
  const bool cut = detail::for_each_descriptor(
      body.bytes, 2, [](Bytes header) { return header[1]; },
      [&out](Bytes header, Bytes value) {
        // SPC-4 4.5.2.2: information descriptor, ADDITIONAL LENGTH 0Ah, VALID bit in byte 2.
        // The first valid one wins, as in sg3_utils (sg_get_sense_info_fld()).
        if (header[0] == 0x00 && value.size() >= 10 && (value[0] & 0x80U) != 0 &&
            !out.information) {
          out.information = load_be64(value, 2);
        }
      });
  out.truncated = out.truncated || cut;
}

}  // namespace

Sense decode_sense(Bytes sense) {
  Sense out;
  if (sense.empty()) {
    out.truncated = true;
    return out;
  }
  out.response_code = sense[0] & 0x7fU;
  switch (out.response_code) {
    case 0x70:
    case 0x71:
      out.format = SenseFormat::kFixed;
      out.deferred = out.response_code == 0x71;
      decode_fixed(sense, out);
      break;
    case 0x72:
    case 0x73:
      out.format = SenseFormat::kDescriptor;
      out.deferred = out.response_code == 0x73;
      decode_descriptor(sense, out);
      break;
    default: break;  // vendor specific (7Fh) or not sense data at all
  }
  return out;
}

SenseCategory classify(const Sense& sense) {
  if (sense.format == SenseFormat::kUnknown) {
    return SenseCategory::kOther;
  }
  switch (sense.sense_key) {
    case SenseKey::kNoSense: return SenseCategory::kNoSense;
    case SenseKey::kRecoveredError: return SenseCategory::kRecovered;
    case SenseKey::kUnitAttention: return SenseCategory::kUnitAttention;
    case SenseKey::kNotReady:
      // SPC-4 annex: 04/01 BECOMING READY, 04/07 OPERATION IN PROGRESS, 04/0A ASYMMETRIC ACCESS
      // STATE TRANSITION.
      if (sense.asc == 0x04 && sense.ascq == 0x01) {
        return SenseCategory::kNotReadyBecomingReady;
      }
      if (sense.asc == 0x04 && sense.ascq == 0x07) {
        return SenseCategory::kNotReadyInProgress;
      }
      if (sense.asc == 0x04 && sense.ascq == 0x0a) {
        return SenseCategory::kNotReadyTransitioning;
      }
      return SenseCategory::kNotReady;
    case SenseKey::kMediumError:
    case SenseKey::kHardwareError: return SenseCategory::kMediumOrHardware;
    case SenseKey::kIllegalRequest: return SenseCategory::kIllegalRequest;
    case SenseKey::kDataProtect: return SenseCategory::kDataProtect;
    case SenseKey::kAbortedCommand: return SenseCategory::kAbortedCommand;
    default: return SenseCategory::kOther;
  }
}

std::string_view to_string(SamStatus status) {
  switch (status) {
    case SamStatus::kGood: return "GOOD";
    case SamStatus::kCheckCondition: return "CHECK CONDITION";
    case SamStatus::kConditionMet: return "CONDITION MET";
    case SamStatus::kBusy: return "BUSY";
    case SamStatus::kReservationConflict: return "RESERVATION CONFLICT";
    case SamStatus::kTaskSetFull: return "TASK SET FULL";
    case SamStatus::kAcaActive: return "ACA ACTIVE";
    case SamStatus::kTaskAborted: return "TASK ABORTED";
  }
  return "unknown status";
}

std::string_view to_string(SenseKey key) {
  switch (key) {
    case SenseKey::kNoSense: return "NO SENSE";
    case SenseKey::kRecoveredError: return "RECOVERED ERROR";
    case SenseKey::kNotReady: return "NOT READY";
    case SenseKey::kMediumError: return "MEDIUM ERROR";
    case SenseKey::kHardwareError: return "HARDWARE ERROR";
    case SenseKey::kIllegalRequest: return "ILLEGAL REQUEST";
    case SenseKey::kUnitAttention: return "UNIT ATTENTION";
    case SenseKey::kDataProtect: return "DATA PROTECT";
    case SenseKey::kBlankCheck: return "BLANK CHECK";
    case SenseKey::kVendorSpecific: return "VENDOR SPECIFIC";
    case SenseKey::kCopyAborted: return "COPY ABORTED";
    case SenseKey::kAbortedCommand: return "ABORTED COMMAND";
    case SenseKey::kObsolete: return "OBSOLETE";
    case SenseKey::kVolumeOverflow: return "VOLUME OVERFLOW";
    case SenseKey::kMiscompare: return "MISCOMPARE";
    case SenseKey::kCompleted: return "COMPLETED";
  }
  return "unknown sense key";
}

}  // namespace blkfence::codec
