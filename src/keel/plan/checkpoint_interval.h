// Failures and checkpoints: how long a save takes, how often to save (Young 1974, Daly 2006), and
// what share of the wall-clock time goes to saving and to redoing the work a failure loses.
//
//   keel::plan::CheckpointPlan c = keel::plan::PlanCheckpoints(job);
//   c.interval_s;  // compute time between saves
//   c.goodput;     // share of the wall-clock time that advances training
//
// First order in (interval + save) / MTBF, like Young's and Daly's derivations: the fractions are
// accurate while saves are much more frequent than failures, and the model says so when not.
#pragma once

#include "keel/plan/job.h"

namespace keel::plan {

// Young's interval sqrt(2·δ·M): δ the time a save costs the run, M the mean time between failures.
double YoungInterval(double delta_s, double mtbf_s);
// Daly's higher-order estimate ("A higher order estimate of the optimum checkpoint interval for
// restart dumps", FGCS 22, 2006, eq. 37): sqrt(2δM)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ
// for δ < 2M, else M. It matches Young when δ ≪ M and stays right when the save is not small.
double DalyInterval(double delta_s, double mtbf_s);

// Bytes a checkpoint of the whole job writes: fp32 master weights and the two AdamW moments,
// 12 per parameter (keel does not write the bf16 working copy, ckpt/state.h).
double CheckpointStateBytes(const Job& job);

struct CheckpointPlan {
  double state_bytes = 0;
  int nodes = 0;
  double storage_bytes_per_s = 0;  // aggregate, as used (the default filled in)
  // keel saves asynchronously (ckpt/writer.h): training waits only while each rank copies its
  // 1/world slice to host memory; the write to storage runs beside the next steps.
  double blocking_s = 0;     // δ: snapshot of one rank's slice at host_bytes_per_s
  double write_s = 0;        // snapshot + write of the whole state at the storage bandwidth
  double restart_s = 0;      // restart_s of the job + reading the state back
  double job_mtbf_s = 0;     // node MTBF / nodes
  double young_s = 0;        // sqrt(2·δ·M)
  double daly_s = 0;         // Daly's higher-order interval
  double interval_s = 0;     // Daly's, or the write time when saves cannot start sooner
  double save_fraction = 0;  // δ / (interval + δ)
  // A failure loses on average half a save period, plus the write lag (the newest save is not yet
  // committed while it is being written), plus the restart: ((τ + δ)/2 + lag + restart) / M.
  double lost_fraction = 0;
  double goodput = 0;  // 1 − save − lost, not below 0

  // With tier-0 copies in a buddy node's memory ([checkpoint] peer_every; 2 nodes or more): the
  // same snapshot, sent to the next node over its NICs; a failed node's ranks restart from the
  // buddy's copy. The shared save then only covers what tier 0 cannot: a node and its buddy lost
  // within one tier-0 period (and the restart), whose mean time is M / p, p that window over the
  // node MTBF.
  bool peer = false;           // nodes >= 2
  double peer_send_s = 0;      // one node's share of the state to its buddy, at its NICs' rate
  double peer_restart_s = 0;   // restart_s of the job + reading a node's share back
  double peer_interval_s = 0;  // Daly's with δ and M, or the send time
  double peer_uncovered_mtbf_s = 0;   // M / p
  double peer_shared_interval_s = 0;  // Daly's with δ and M / p
  double peer_save_fraction = 0;      // both tiers' snapshots
  double peer_lost_fraction = 0;
  double peer_goodput = 0;
};

CheckpointPlan PlanCheckpoints(const Job& job);

}  // namespace keel::plan
