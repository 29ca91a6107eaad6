// The C++ FedRep round kernels (fedjax_rep/native/fedrep_round.cc) timed outside XLA: the
// same chunks on std::threads instead of XLA's pool, so their time can be split from the
// call's and compared with the data in cache.
//
//   c++ -O3 -std=c++17 -march=native -pthread -o /tmp/native_harness
//       -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" benchmarks/native_harness.cc
//   (one command)
//   /tmp/native_harness                       # n = 100,000, 1 and 2 threads, 7 repeats
//   /tmp/native_harness 100000 5 /tmp/harness.json   # n, repeats, JSON rows
//
// Rows (d = 50, k = 5, m = 10 as benchmarks/linear_round.py; ms per round of n clients,
// the minimum over interleaved repeats):
//   fixed            X [n, m, d] streamed from memory (the prefetch stream on);
//   fixed, in cache  the same work as n / 1,000 passes over 1,000 clients' data (2 MB), the
//                    threads taking passes in turn: the kernel's compute alone;
//   fresh            the fresh-statistics round (p = 2k = 10), its samples drawn in cache.
#include "../fedjax_rep/native/fedrep_round.cc"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace {

constexpr int64_t kSamples = 10, kDim = 50, kRep = 5, kCached = 1000;

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void prepare(Job& job) {
  job.chunks = (job.n + kChunk - 1) / kChunk;
  job.partial.assign(job.chunks * job.stride(), 0.0f);
}

// Seconds to run `job`'s chunks on `threads` threads (this one included).
double seconds(std::shared_ptr<Job> job, int threads) {
  prepare(*job);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back([job] { work(*job); });
  work(*job);
  for (auto& helper : helpers) helper.join();
  return since(start);
}

struct Data {
  std::vector<float> X, y, counts, heads, B, W, C, C_star;
};

std::shared_ptr<Job> fixed_job(Data& data, int64_t n, float* heads) {
  auto job = std::make_shared<Job>();
  job->n = n; job->m = kSamples; job->d = kDim; job->k = kRep;
  job->X = data.X.data(); job->y = data.y.data(); job->counts = data.counts.data();
  job->heads = heads;
  job->B = padded_rows(data.B.data(), kDim, kRep);
  return job;
}

// Seconds for `threads` threads to share n / kCached passes over the first kCached clients,
// each pass a job of one thread.
double cached_seconds(Data& data, int64_t n, int threads) {
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<std::vector<float>> heads(n / kCached, std::vector<float>(kCached * kRep));
  for (auto& h : heads) {
    jobs.push_back(fixed_job(data, kCached, h.data()));
    prepare(*jobs.back());
  }
  auto passes = [&](int first) {
    for (size_t pass = first; pass < jobs.size(); pass += threads) work(*jobs[pass]);
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(passes, t);
  passes(0);
  for (auto& helper : helpers) helper.join();
  return since(start);
}

std::shared_ptr<Job> fresh_job(Data& data, int64_t n) {
  auto job = std::make_shared<Job>();
  const int64_t p = 2 * kRep;
  job->n = n; job->m = kSamples; job->d = p; job->k = kRep;
  job->heads = data.heads.data();
  job->B = padded_rows(data.C.data(), p, kRep);
  job->B_star = padded_rows(data.C_star.data(), p, kRep);
  job->key[0] = 0; job->key[1] = 42;
  job->heads_star = data.W.data();
  job->noise_std = 0.03f;
  job->draw = (kSamples * (p + 1) + kDraw - 1) / kDraw * kDraw;
  return job;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atol(argv[1]) : 100000;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  const char* json = argc > 3 ? argv[3] : nullptr;
  if (n < kCached || n % kCached || repeats < 1) {
    std::fprintf(stderr, "usage: %s [n: a multiple of %ld] [repeats >= 1] [json path]\n",
                 argv[0], static_cast<long>(kCached));
    return 2;
  }
  Data data;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  auto fill = [&](std::vector<float>& v, int64_t size, float scale) {
    v.resize(size);
    for (auto& x : v) x = scale * normal(rng);
  };
  fill(data.X, n * kSamples * kDim, 1.0f);
  fill(data.y, n * kSamples, 1.0f);
  fill(data.B, kDim * kRep, 1.0f / 7.0f);
  fill(data.W, n * kRep, 1.0f);
  fill(data.C, 2 * kRep * kRep, 1.0f);
  fill(data.C_star, 2 * kRep * kRep, 1.0f);
  data.counts.assign(n, static_cast<float>(kSamples));
  data.heads.assign(n * kRep, 0.0f);

  const char* names[3] = {"fixed", "fixed, in cache", "fresh"};
  const int thread_counts[2] = {1, 2};
  double best[3][2];
  for (auto& row : best) row[0] = row[1] = 1e30;
  for (int rep = 0; rep < repeats; ++rep)
    for (int t = 0; t < 2; ++t) {
      const int threads = thread_counts[t];
      best[0][t] = std::min(best[0][t], seconds(fixed_job(data, n, data.heads.data()), threads));
      best[1][t] = std::min(best[1][t], cached_seconds(data, n, threads));
      best[2][t] = std::min(best[2][t], seconds(fresh_job(data, n), threads));
    }
  std::printf("n = %ld, d = %ld, k = %ld, m = %ld; ms per round, minimum of %d\n",
              static_cast<long>(n), static_cast<long>(kDim), static_cast<long>(kRep),
              static_cast<long>(kSamples), repeats);
  std::printf("%-16s %10s %10s\n", "round", "1 thread", "2 threads");
  for (int r = 0; r < 3; ++r)
    std::printf("%-16s %10.2f %10.2f\n", names[r], best[r][0] * 1e3, best[r][1] * 1e3);
  std::printf("fresh / fixed: %.2f (1 thread), %.2f (2 threads)\n", best[2][0] / best[0][0],
              best[2][1] / best[0][1]);
  if (json != nullptr) {
    FILE* f = std::fopen(json, "w");
    if (f == nullptr) {
      std::perror(json);
      return 1;
    }
    std::fprintf(f, "{\"n\": %ld, \"rows\": [", static_cast<long>(n));
    for (int r = 0; r < 3; ++r)
      for (int t = 0; t < 2; ++t)
        std::fprintf(f, "%s{\"round\": \"%s\", \"threads\": %d, \"ms_per_round\": %.4f}",
                     r + t ? ", " : "", names[r], thread_counts[t], best[r][t] * 1e3);
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
