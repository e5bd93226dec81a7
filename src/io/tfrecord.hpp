#pragma once
// TFRecord framing, the container of TensorBoard's event files:
//   uint64 length | uint32 masked CRC32C(length) | data | uint32 masked CRC32C(data)
// little-endian. Independent of protobuf: the payload is bytes.

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): crc32c("123456789") = 0xE3069283.
std::uint32_t crc32c(const void* data, std::size_t size);
// TensorFlow's mask, so that a CRC of data holding CRCs is not degenerate.
std::uint32_t masked_crc32c(const void* data, std::size_t size);
// One record: the 16 bytes of header and trailer around `data`.
std::string tfrecord(const std::string& data);

}  // namespace ddp
