// TensorBoard event files: TFRecord framing and the few Event protobuf fields, by hand.
#include "io/tensorboard_events.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <span>

#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"

namespace zt::io {
namespace {

// Protobuf wire types.
constexpr std::uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, std::uint32_t field, std::uint32_t wire_type) {
  put_varint(out, (field << 3) | wire_type);
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 are little-endian
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_header(double wall_time) {
  std::string event;
  put_key(event, 1, kFixed64);  // Event.wall_time
  put_little_endian(event, wall_time);
  put_bytes(event, 3, "brain.Event:2");  // Event.file_version
  return event;
}

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t crc = crc32c(std::as_bytes(std::span(bytes.data(), bytes.size())));
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8U;
}

std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);     // Summary.Value.tag
  put_key(summary_value, 2, kFixed32);  // Summary.Value.simple_value
  put_little_endian(summary_value, value);
  std::string summary;
  put_bytes(summary, 1, summary_value);  // Summary.value
  std::string event;
  put_key(event, 1, kFixed64);  // Event.wall_time
  put_little_endian(event, wall_time);
  put_key(event, 2, kVarint);  // Event.step
  put_varint(event, static_cast<std::uint64_t>(step));
  put_bytes(event, 5, summary);  // Event.summary
  return event;
}

TensorBoardEventFile::TensorBoardEventFile(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  ZT_CHECK_AS(IoError, !error, "tensorboard: cannot create directory '", directory, "': ", error.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const double now = seconds_since_epoch();
  path_ = (std::filesystem::path(directory) /
           ("events.out.tfevents." + std::to_string(static_cast<std::int64_t>(now)) + "." + host + "." +
            std::to_string(getpid()) + ".0"))
              .string();
  out_.open(path_, std::ios::out | std::ios::binary | std::ios::trunc);
  ZT_CHECK_AS(IoError, out_.good(), "tensorboard: cannot write event file '", path_, "'");
  write_record(event_header(now));
  flush();
}

void TensorBoardEventFile::add_scalar(std::string_view tag, double value, std::int64_t step,
                                      double wall_time) {
  write_record(scalar_event(wall_time, step, tag, static_cast<float>(value)));
}

void TensorBoardEventFile::flush() {
  out_.flush();
  ZT_CHECK_AS(IoError, out_.good(), "tensorboard: writing event file '", path_, "' failed");
}

void TensorBoardEventFile::write_record(std::string_view data) {
  std::string header;
  put_little_endian(header, static_cast<std::uint64_t>(data.size()));
  std::string record = header;
  put_little_endian(record, masked_crc32c(header));
  record.append(data);
  put_little_endian(record, masked_crc32c(data));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
}

}  // namespace zt::io
