// Before a job's first collective that can hang or truncate, its ranks agree that each set up
// without error and that all are about to run the same thing. Without this, a rank that failed
// to open its data left the others waiting in a collective until comm_timeout_s (exit 75, the
// real error never shown), a rank with another model shape failed inside MPI (MPI_ERR_TRUNCATE),
// and ranks with different configs or data trained diverging replicas that one checkpoint mixed.
//
//   std::optional<Error> failed;
//   try { ... setup that reads input ... } catch (const Error& e) { failed = e; }
//   AgreeOnSetup(comm, failed, fingerprint);   // throws alike on every rank, or returns on all
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "keel/core/error.h"
#include "keel/data/dataset.h"
#include "keel/parallel/comm.h"
#include "keel/train/config.h"

namespace keel::train {

// What the ranks must agree on: (key, value) pairs in a fixed order.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

// The resolved config, key by key (section.key as ToToml writes them, the resolved model shape
// with them), minus the data paths: one machine may mount the data elsewhere, so each source's
// identity stands for it (`data.train`, `data.val`, `data.sources[i]`, from DataIdentity).
Fingerprint ConfigFingerprint(const RunConfig& cfg);
// A dataset's identity: its token count and its shards' xxh3s from meta.json; for a flat file
// its size and the xxh3 of its bytes (above 256 MiB, of 64 evenly spread 1 MiB blocks: a
// sampled check, so that a 100 GB file costs 64 MiB of reading).
std::string DataIdentity(const data::TokenDataset& ds, const std::string& path);
// A file's size and xxh3 (sampled above 256 MiB, as for datasets).
std::string FileIdentity(const std::string& path);
// `model.init_from`'s identity: the file's, or for a folder every file's, so that ranks given
// the same path with different contents are refused rather than trained from different weights.
std::string InitIdentity(const std::string& path);

// Collective over `comm`; every rank calls it at the same point of its setup.
// `failed`: this rank's setup error. If any rank failed, the lowest such rank's message and exit
// code reach every rank, rank 0 prints it ("rank N on HOST: ..." when it is another rank's)
// before any rank leaves, and all throw it quietly (Error::quiet): the job prints it once and
// exits with its code.
// Otherwise each rank's fingerprint is compared with rank 0's: the first key on which a rank
// differs is exit 2 on every rank, naming the rank, the key and both values.
void AgreeOnSetup(parallel::Comm& comm, const std::optional<Error>& failed,
                  const Fingerprint& fingerprint);

// Collective over `comm`: if any rank holds an error, every rank throws the lowest such rank's,
// printed once (as AgreeOnSetup); returns on every rank otherwise.
void ShareError(parallel::Comm& comm, const std::optional<Error>& error);

}  // namespace keel::train
