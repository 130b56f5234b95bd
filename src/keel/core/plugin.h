// The parts of keel that are loaded at run time instead of linked: libkeel_cuda.so (the CUDA
// backend, loaded by kernels::Get) and libkeel_nccl.so (the NCCL communicator, loaded by
// parallel::MakeNcclComm) today, any other accelerator's backend the same way. Linking cuBLASLt
// and NCCL into `keel` gave every thread ~110 KiB of static TLS (civetweb's threads could not
// start) and made a CPU run load CUDA; loaded with dlopen only when a run asks for a GPU, a CPU
// run never maps them.
//
// A plugin "NAME" is the file libkeel_NAME.so, looked for in $KEEL_PLUGIN_DIR, then beside the
// running executable (the build folder), then in ../lib/keel next to it (an install). It is
// built from the same sources as the executable and resolves keel's own symbols against it
// (executables export them: CMakeLists.txt, ENABLE_EXPORTS), so there is one copy of keel's state;
// a plugin needs only keel symbols that its loader's own object file brings into the executable
// (the base class it implements), which is why the backend and the communicator are two plugins:
// a kernel test that never links Comm can still load the backend. Each entry point is an
// extern "C" function that returns a keel object, e.g. keel_cuda_backend().
// keel_plugin_interface() returns the hash of the headers both sides were compiled against; a
// plugin from other sources is refused instead of calling through a different vtable.
//
//   auto f = PluginEntry<const Backend* (*)()>("cuda", "keel_cuda_backend", "[train] device");
#pragma once

#include <string>

namespace keel {

// Where plugin `name` would be loaded from; empty when no such file exists.
std::string PluginPath(const std::string& name);

// The address of `symbol` in plugin `name`, loading it once. Throws BadInput with one line that
// starts with `context` and names what is missing: the file (and where it was looked for), a
// library it needs (dlopen's own words), the symbol, or a plugin of other sources.
void* PluginSymbol(const std::string& name, const char* symbol, const std::string& context);

template <typename Fn>
Fn PluginEntry(const std::string& name, const char* symbol, const std::string& context) {
  return reinterpret_cast<Fn>(PluginSymbol(name, symbol, context));
}

// The interface hash this executable was built with (KEEL_PLUGIN_INTERFACE), which a plugin's
// keel_plugin_interface() must return.
const char* PluginInterface();

}  // namespace keel
