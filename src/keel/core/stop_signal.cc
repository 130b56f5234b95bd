#include "keel/core/stop_signal.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace keel {
namespace {

std::atomic<bool> g_installed{false};
std::atomic<int> g_scopes{0};
std::atomic<bool> g_requested{false};

void OnSignal(int) { g_requested = true; }  // the fallback: only an atomic store

void WaitForSignals(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    // The first signal in a scope asks to stop; a second one means "now" (a checkpoint being cut
    // short is safe: nothing uncommitted is ever read).
    if (g_scopes.load() > 0 && !g_requested.exchange(true)) continue;
    // Nobody asked to be told: the default action (terminate) on this thread, as if unhandled.
    std::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    std::raise(sig);
  }
}

}  // namespace

void InstallStopSignals() {
  if (g_installed.exchange(true)) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(WaitForSignals, set).detach();
}

StopScope::StopScope() {
  g_requested = false;
  if (g_scopes.fetch_add(1) == 0 && !g_installed) {
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    std::signal(SIGUSR2, OnSignal);
  }
}

StopScope::~StopScope() {
  if (g_scopes.fetch_sub(1) == 1 && !g_installed) {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGUSR2, SIG_DFL);
  }
}

bool StopScope::requested() const { return g_requested.load(); }

}  // namespace keel
