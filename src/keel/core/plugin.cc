#include "keel/core/plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include "keel/core/error.h"

#ifndef KEEL_PLUGIN_INTERFACE
#error "KEEL_PLUGIN_INTERFACE: defined by CMakeLists.txt from the hash of the plugin headers"
#endif

namespace keel {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> SearchDirs() {
  std::vector<fs::path> dirs;
  if (const char* d = std::getenv("KEEL_PLUGIN_DIR"); d != nullptr && *d != '\0') dirs.push_back(d);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back(exe.parent_path());
    dirs.push_back(exe.parent_path().parent_path() / "lib" / "keel");
  }
  return dirs;
}

std::string FileName(const std::string& name) { return "libkeel_" + name + ".so"; }

std::mutex mu;
std::map<std::string, void*> loaded;  // name → dlopen handle, never closed: CUDA stays mapped

}  // namespace

const char* PluginInterface() { return KEEL_PLUGIN_INTERFACE; }

std::string PluginPath(const std::string& name) {
  for (const fs::path& dir : SearchDirs()) {
    std::error_code ec;
    const fs::path p = dir / FileName(name);
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

void* PluginSymbol(const std::string& name, const char* symbol, const std::string& context) {
  std::lock_guard<std::mutex> lock(mu);
  void*& handle = loaded[name];
  if (handle == nullptr) {
    const std::string path = PluginPath(name);
    if (path.empty()) {
      std::string where;
      for (const fs::path& dir : SearchDirs()) where += (where.empty() ? "" : ", ") + dir.string();
      ThrowBadInput(context + ": no " + FileName(name) + " in " + where +
                    " (this keel was built without it: build where the toolkit it needs is "
                    "installed; see README)");
    }
    // RTLD_NOW: a library or symbol that is missing shows here, as one line, not as a crash in
    // the middle of a step. RTLD_LOCAL: its CUDA symbols stay out of everything loaded later.
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) ThrowBadInput(context + ": cannot load " + path + ": " + dlerror());
    using InterfaceFn = const char* (*)();
    auto interface = reinterpret_cast<InterfaceFn>(dlsym(h, "keel_plugin_interface"));
    if (interface == nullptr || std::strcmp(interface(), PluginInterface()) != 0) {
      const std::string theirs = interface ? interface() : "none";
      dlclose(h);
      ThrowBadInput(context + ": " + path + " was built from other keel sources (interface " +
                    theirs + ", this keel's " + PluginInterface() + "): rebuild it with keel");
    }
    handle = h;
  }
  void* f = dlsym(handle, symbol);
  if (f == nullptr)
    ThrowBadInput(context + ": " + PluginPath(name) + " has no " + symbol +
                  " (a plugin of another kind under this name?)");
  return f;
}

}  // namespace keel
