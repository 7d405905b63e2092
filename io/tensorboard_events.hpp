// TensorBoard event files written directly (docs/metrics.md): TFRecord framing around Event
// protocol buffers with scalar summaries, encoded by hand (no protobuf library).
//
// A record is: uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes, the data,
// uint32 masked CRC32C of the data; the mask is ((crc >> 15) | (crc << 17)) + 0xa282ead8. The
// first event carries file_version "brain.Event:2"; each later one wall_time (1, double), step
// (2, int64) and summary (5) = Summary { value (1) = Value { tag (1), simple_value (2, float) } }.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace zt::io {

/// TFRecord's checksum of `bytes`: CRC32C rotated right by 15 bits plus 0xa282ead8.
std::uint32_t masked_crc32c(std::string_view bytes);

/// One Event protobuf with one scalar summary value (the wire bytes).
std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value);

class TensorBoardEventFile {
 public:
  /// Creates `directory` (and its parents) and a new file in it named as TensorBoard's own writers
  /// name theirs, events.out.tfevents.<seconds>.<host>.<pid>.0, starting with the version event.
  explicit TensorBoardEventFile(const std::string& directory);

  void add_scalar(std::string_view tag, double value, std::int64_t step, double wall_time);
  /// Pushes what was added to the file (once per step: a killed run keeps its finished steps).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);

  std::string path_;
  std::ofstream out_;
};

}  // namespace zt::io
