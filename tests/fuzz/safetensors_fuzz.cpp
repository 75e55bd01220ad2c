// Fuzzes read_safetensors() (scmoe/models/safetensors.h) with the input as the whole file. Bad files must
// throw scmoe::Error; a file it accepts must describe itself consistently (every tensor's bytes =
// numel x element size) and survive a write / read round trip unchanged.
#include <cstddef>
#include <cstdint>

#include "scmoe/kernels/error.h"
#include "scmoe/models/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

using scmoe::SafetensorsFile;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const scmoe::fuzz::ScratchFile input("safetensors-in"), output("safetensors-out");
    input.write(data, size);
    SafetensorsFile file;
    try {
        file = scmoe::read_safetensors(input.path());
    } catch (const scmoe::Error&) {
        return 0;
    }
    std::vector<scmoe::SafetensorsTensor> tensors;
    for (const auto& [name, entry] : file.tensors) {
        const std::int64_t numel = entry.numel();
        if (numel < 0 ||
            static_cast<std::uint64_t>(numel) * scmoe::safetensors_dtype_size(entry.dtype) != entry.bytes.size())
            scmoe::fuzz::property_failed("a tensor's bytes differ from numel x element size");
        tensors.push_back({name, entry.dtype, entry.shape, entry.bytes.data()});
    }
    try {
        scmoe::write_safetensors(output.path(), tensors, file.metadata);
    } catch (const scmoe::Error&) {
        return 0;  // e.g. a name the writer reserves ("" is legal to read, not to write)
    }
    const SafetensorsFile again = scmoe::read_safetensors(output.path());
    if (again.metadata != file.metadata) scmoe::fuzz::property_failed("metadata changed in a round trip");
    if (again.tensors.size() != file.tensors.size()) scmoe::fuzz::property_failed("tensors changed in a round trip");
    for (const auto& [name, entry] : file.tensors) {
        const auto it = again.tensors.find(name);
        if (it == again.tensors.end() || it->second.dtype != entry.dtype || it->second.shape != entry.shape ||
            it->second.bytes != entry.bytes)
            scmoe::fuzz::property_failed("a tensor changed in a round trip");
    }
    return 0;
}
