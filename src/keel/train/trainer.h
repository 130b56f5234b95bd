// The trainer: wires one step of everything (data, model, gradient sync, optimizer, metrics) and
// runs the loop. Parse, build, train, close on every path.
//
//   auto comm = keel::parallel::CreateComm();
//   TrainSummary s = keel::train::Train(cfg, *comm);
#pragma once

#include <optional>
#include <string>

#include "keel/parallel/comm.h"
#include "keel/train/config.h"

namespace keel::train {

struct TrainSummary {
  int steps_done = 0;
  double last_loss = 0;
  std::optional<double> val_loss;  // none when there is no validation set
  double unigram_entropy = 0;      // nats per token of the training data
  bool interrupted = false;        // stopped by SIGINT/SIGTERM
  bool nothing_left = false;       // resumed at train.steps: the run was already finished
  std::string run_dir;
  std::string resumed_from;  // the checkpoint folder a resumed run started from; "" otherwise
  bool switched = false;     // an fp16 run switched to bf16 at its last step (and saved there)
};

// Throws keel::Error: kBadInput for a config or data problem found before the first step (and
// then nothing is written), kTempFail for a lost peer, kRuntime otherwise.
TrainSummary Train(const RunConfig& cfg, parallel::Comm& comm);

}  // namespace keel::train
