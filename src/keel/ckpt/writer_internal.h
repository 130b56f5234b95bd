// What the checkpoint writer's two files (writer.cc: the writer thread, the file and the commit;
// writer_snapshot.cc: staging and the snapshot) share. Private to ckpt/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace keel::ckpt {

// n bf16 values at the start of `p` widened to fp32 in place.
void WidenInPlace(uint8_t* p, size_t n);
// This thread's CPU time so far, user and kernel, in ms.
std::pair<double, double> ThreadCpuMs();
// Writes all of `bytes`, retrying short writes; throws with the path, progress and errno text.
void WriteAll(int fd, const uint8_t* p, size_t n, const std::string& path);

}  // namespace keel::ckpt
