// Retention: which committed checkpoints stay after a new one is committed. Deletion renames a
// folder out of the step_ namespace first, so a crash mid-delete never leaves a half-deleted
// folder that looks like a checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "keel/ckpt/writer.h"

namespace keel::ckpt {

// Deletes the committed checkpoints of `root` that the policy does not keep: it keeps the newest
// keep_last, every step that is a multiple of keep_every, `current` (just committed) and what
// `latest` names. Also clears leftovers of crashes: .tmp folders of steps below `current` (a
// newer .tmp may be another rank's save in flight) and half-deleted folders. Returns the names of
// the checkpoints deleted. Errors are ignored: retention must never fail a save.
std::vector<std::string> ApplyRetention(const std::string& root, int64_t current,
                                        const Retention& policy);

}  // namespace keel::ckpt
