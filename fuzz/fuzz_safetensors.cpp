// libFuzzer target: arbitrary bytes as a safetensors file. Any input must either parse into
// views that lie inside the buffer, or raise perry::Error — never crash or read out of bounds.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto tensors = perry::io::SafetensorsFile::parse(data, size, "fuzz");
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : tensors) {
      if (t.nbytes) {  // touch first and last byte: ASan flags any view outside the input
        sink = uint8_t(sink ^ t.data[0]);  // (plain assignment: compound ones on volatile are deprecated)
        sink = uint8_t(sink ^ t.data[t.nbytes - 1]);
      }
    }
  } catch (const perry::Error&) {
  }
  return 0;
}
