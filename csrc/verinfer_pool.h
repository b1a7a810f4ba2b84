// verinfer._kernels: the decode step's thread pool.
//
// A decode step of a small model is ~100-300 short kernel calls (10-500 us each). OpenMP's
// workers (at::parallel_for) go to sleep between them, and waking one costs ~50-70 us per
// parallel region here, as much as the work it would take over. This pool's workers instead
// spin (pause, then sched_yield) for a few milliseconds after their last task, so inside a
// decode step a region starts in about a microsecond, and only then sleep on a condition
// variable. Tasks only decide WHICH thread computes an output, never how, so results are
// bit-identical to a serial run (the kernels' invariance tests run both).
//
// Claiming is lock-free: one 64-bit ticket holds (job id, task count, next task index); a
// thread claims task i with one fetch_add and runs it only if i < count. The caller runs
// tasks too and waits only for tasks a worker has claimed, never for a worker to wake, so a
// descheduled or sleeping worker (a loaded machine, a forked child without the threads) can
// slow a region down to one thread but never stall it.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <immintrin.h>

namespace vi {

class SpinPool {
 public:
  static constexpr int64_t kMaxTasks = 1 << 16;  // the ticket's index field must not overflow
  explicit SpinPool(int threads) : threads_(threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
    for (std::thread& t : workers_) t.detach();  // the pool lives as long as the process
  }
  SpinPool(const SpinPool&) = delete;
  SpinPool& operator=(const SpinPool&) = delete;

  int threads() const { return threads_; }

  // fn(i) for every i in [0, n) (n <= kMaxTasks) across the caller and the workers; returns when all
  // are done. False (and nothing run) if another caller holds the pool: run it yourself.
  bool run(int64_t n, const std::function<void(int64_t)>& fn) {
    if (n <= 0 || n > kMaxTasks) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const uint64_t id = (ticket_.load(std::memory_order_relaxed) >> kIdShift) + 1;
    Slot& s = slots_[id & 1];
    s.fn = &fn;
    s.done.store(0, std::memory_order_relaxed);
    ticket_.store((id << kIdShift) | (static_cast<uint64_t>(n) << kCountShift), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(sleep_mu_);
      sleep_cv_.notify_all();
    }
    claim_all();
    while (s.done.load(std::memory_order_acquire) < n) _mm_pause();
    return true;
  }

 private:
  static constexpr int kIdShift = 40, kCountShift = 20;
  static constexpr uint64_t kMask = (uint64_t{1} << 20) - 1;
  static constexpr auto kSpin = std::chrono::milliseconds(4);  // > the gaps inside a decode step
  struct Slot {  // job id's function lives in slots_[id & 1]: job id + 2 starts after id is done
    const std::function<void(int64_t)>* fn = nullptr;
    std::atomic<int64_t> done{0};
  };

  // Claims and runs tasks of the current job until none are left.
  void claim_all() {
    for (;;) {
      const uint64_t t = ticket_.fetch_add(1, std::memory_order_acq_rel);
      const uint64_t id = t >> kIdShift;
      const int64_t i = static_cast<int64_t>(t & kMask), n = static_cast<int64_t>((t >> kCountShift) & kMask);
      if (i >= n) return;  // i < n: job id is unfinished, so its slot is live (whoever expected it)
      Slot& s = slots_[id & 1];
      (*s.fn)(i);
      s.done.fetch_add(1, std::memory_order_release);
    }
  }

  void work() {
    uint64_t seen = ticket_.load(std::memory_order_acquire) >> kIdShift;
    for (;;) {
      uint64_t id = ticket_.load(std::memory_order_acquire) >> kIdShift;
      auto start = std::chrono::steady_clock::now();
      for (int spins = 0; id == seen; ++spins) {
        if (spins < 2000) {
          _mm_pause();
        } else if (std::chrono::steady_clock::now() - start < kSpin) {
          sched_yield();  // let anything else runnable on this core go first
        } else {
          std::unique_lock<std::mutex> lk(sleep_mu_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          sleep_cv_.wait(lk, [&] { return (ticket_.load(std::memory_order_seq_cst) >> kIdShift) != seen; });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          start = std::chrono::steady_clock::now(), spins = 0;
        }
        id = ticket_.load(std::memory_order_acquire) >> kIdShift;
      }
      seen = id;
      claim_all();
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex busy_;
  std::atomic<uint64_t> ticket_{0};
  Slot slots_[2];
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
};

}  // namespace vi
