// One FedRep round of clients with fixed data, on the CPU, as an XLA FFI custom call
// (fedjax_rep/linear/native_round.py): every client's exact least-squares head and the sum of
// the clients' gradients in B, with each client's data read from memory once.
//
// For X [n, m, d], y [n, m], counts [n] (real samples per client) and B [d, k], k <= 8:
//   Z_i = X_i B,  w_i = (Z_i^T Z_i + lam_i I)^-1 Z_i^T y_i,
//   lam_i = 1e-6 trace(Z_i^T Z_i) / k + FLT_MIN,  r_i = Z_i w_i - y_i,
//   heads [n, k] = w,  gradient [k, d] = sum_i w_i (X_i^T r_i)^T / counts_i,
//   loss [] = sum_i ||r_i||^2 / (2 counts_i).
// Z_i is computed per client with the k features in the lanes of a 256-bit register; the
// heads of 8 clients at a time are solved with the clients in the lanes (an unrolled
// Cholesky, no reduction across lanes); X_i^T r_i reads the client's rows again while they
// are in L1, 64 columns at a time in registers. Meanwhile a prefetch stream, one cache line a
// step of those loops, brings in the data of the clients kAhead on. Chunks of kChunk clients
// run on XLA's intra-op thread pool and their sums are added in chunk order, so the result
// does not depend on the number of threads.
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8 __attribute__((vector_size(32)));
constexpr int kLanes = 8;        // k <= kLanes; clients per group
constexpr int kRows = 12;        // sample rows whose features are accumulated together
constexpr int64_t kChunk = 512;  // clients per unit of work (a multiple of kLanes)
constexpr int64_t kAhead = 4;    // clients whose data are prefetched ahead of the one in work
constexpr int kLocality = 3;     // __builtin_prefetch's: keep in all cache levels

struct Job {
  const float* X;
  const float* y;
  const float* counts;
  float* heads;
  std::vector<v8> B;  // [d] rows of B, zero-padded to kLanes
  int64_t n, m, d, k, chunks;
  std::vector<float> partial;  // [chunks, k * d + 1]: gradient sums and loss per chunk
  std::atomic<int64_t> next{0}, done{0};
};

// The prefetch of the clients' data ahead of the computation, one cache line a step. The
// steps are spread over the loops (one a column of the features, one a row of the gradient):
// a burst of prefetches at once stalls the core, and spread out they keep the memory busy
// while the core computes.
struct Stream {
  const char* next;   // the next line to prefetch
  const char* limit;  // the end of the data of the client kAhead clients on
  inline void step() {
    if (next < limit) {
      __builtin_prefetch(next, 0, kLocality);
      next += 64;
    }
  }
};

// z[r] = x[r] B (lanes: the k features) for the R rows x [R, d].
template <int R>
inline void feature_rows(const float* x, const v8* B, int64_t d, v8* z, Stream& stream) {
  v8 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = v8{};
  for (int64_t l = 0; l < d; ++l) {
    stream.step();
    const v8 b = B[l];
    for (int r = 0; r < R; ++r) acc[r] += x[r * d + l] * b;
  }
  for (int r = 0; r < R; ++r) z[r] = acc[r];
}

// z[j] = x[j] B (lanes: the k features) for the m rows x [m, d].
void features(const float* x, const v8* B, int64_t m, int64_t d, v8* z, Stream& stream) {
  int64_t j = 0;
  for (; j + kRows <= m; j += kRows) feature_rows<kRows>(x + j * d, B, d, z + j, stream);
  switch (m - j) {
    case 11: feature_rows<11>(x + j * d, B, d, z + j, stream); break;
    case 10: feature_rows<10>(x + j * d, B, d, z + j, stream); break;
    case 9: feature_rows<9>(x + j * d, B, d, z + j, stream); break;
    case 8: feature_rows<8>(x + j * d, B, d, z + j, stream); break;
    case 7: feature_rows<7>(x + j * d, B, d, z + j, stream); break;
    case 6: feature_rows<6>(x + j * d, B, d, z + j, stream); break;
    case 5: feature_rows<5>(x + j * d, B, d, z + j, stream); break;
    case 4: feature_rows<4>(x + j * d, B, d, z + j, stream); break;
    case 3: feature_rows<3>(x + j * d, B, d, z + j, stream); break;
    case 2: feature_rows<2>(x + j * d, B, d, z + j, stream); break;
    case 1: feature_rows<1>(x + j * d, B, d, z + j, stream); break;
    default: break;
  }
}

// In place: row r of the 8 x 8 matrix v becomes its column r.
inline void transpose8(v8* v) {
#if defined(__AVX__)
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = (__m256)v[i];
  t[0] = _mm256_unpacklo_ps(r[0], r[1]); t[1] = _mm256_unpackhi_ps(r[0], r[1]);
  t[2] = _mm256_unpacklo_ps(r[2], r[3]); t[3] = _mm256_unpackhi_ps(r[2], r[3]);
  t[4] = _mm256_unpacklo_ps(r[4], r[5]); t[5] = _mm256_unpackhi_ps(r[4], r[5]);
  t[6] = _mm256_unpacklo_ps(r[6], r[7]); t[7] = _mm256_unpackhi_ps(r[6], r[7]);
  r[0] = _mm256_shuffle_ps(t[0], t[2], 0x44); r[1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
  r[2] = _mm256_shuffle_ps(t[1], t[3], 0x44); r[3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
  r[4] = _mm256_shuffle_ps(t[4], t[6], 0x44); r[5] = _mm256_shuffle_ps(t[4], t[6], 0xEE);
  r[6] = _mm256_shuffle_ps(t[5], t[7], 0x44); r[7] = _mm256_shuffle_ps(t[5], t[7], 0xEE);
  for (int i = 0; i < 4; ++i) {
    v[i] = (v8)_mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    v[i + 4] = (v8)_mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
#else
  v8 t[8];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) t[j][i] = v[i][j];
  for (int i = 0; i < 8; ++i) v[i] = t[i];
#endif
}

inline v8 sqrt8(v8 x) {
#if defined(__AVX__)
  return (v8)_mm256_sqrt_ps((__m256)x);
#else
  for (int i = 0; i < 8; ++i) x[i] = std::sqrt(x[i]);
  return x;
#endif
}

// grad[a][l0 + l] += w[a] g[l] for g = x^T s over the columns l0 .. l0 + 8T - 1 of the m rows
// x [m, d]: g is kept in T registers.
template <int T>
inline void gradient_tile(const float* x, const float* s, const float* w, int64_t m, int64_t d,
                          int64_t k, int64_t l0, float* grad, Stream& stream) {
  v8 g[T];
  for (int t = 0; t < T; ++t) g[t] = v8{};
  for (int64_t j = 0; j < m; ++j) {
    stream.step();
    const float* row = x + j * d + l0;
    for (int t = 0; t < T; ++t) {
      v8 v;
      __builtin_memcpy(&v, row + t * kLanes, sizeof(v));
      g[t] += s[j] * v;
    }
  }
  for (int64_t a = 0; a < k; ++a) {
    float* out = grad + a * d + l0;
    for (int t = 0; t < T; ++t) {
      v8 v;
      __builtin_memcpy(&v, out + t * kLanes, sizeof(v));
      v += w[a] * g[t];
      __builtin_memcpy(out + t * kLanes, &v, sizeof(v));
    }
  }
}

// grad [k, d] += w (x^T s)^T for one client's rows x [m, d], scaled residuals s [m] and head
// w [k].
void client_gradient(const float* x, const float* s, const float* w, int64_t m, int64_t d,
                     int64_t k, float* grad, Stream& stream) {
  int64_t l = 0;
  for (; l + 8 * kLanes <= d; l += 8 * kLanes) gradient_tile<8>(x, s, w, m, d, k, l, grad, stream);
  switch ((d - l) / kLanes) {
    case 7: gradient_tile<7>(x, s, w, m, d, k, l, grad, stream); break;
    case 6: gradient_tile<6>(x, s, w, m, d, k, l, grad, stream); break;
    case 5: gradient_tile<5>(x, s, w, m, d, k, l, grad, stream); break;
    case 4: gradient_tile<4>(x, s, w, m, d, k, l, grad, stream); break;
    case 3: gradient_tile<3>(x, s, w, m, d, k, l, grad, stream); break;
    case 2: gradient_tile<2>(x, s, w, m, d, k, l, grad, stream); break;
    case 1: gradient_tile<1>(x, s, w, m, d, k, l, grad, stream); break;
    default: break;
  }
  for (l += (d - l) / kLanes * kLanes; l < d; ++l) {
    float g = 0.0f;
    for (int64_t j = 0; j < m; ++j) g += s[j] * x[j * d + l];
    for (int64_t a = 0; a < k; ++a) grad[a * d + l] += w[a] * g;
  }
}

// Clients first..first+count-1 (count <= kLanes) of the job, lanes over clients.
void run_group(Job& job, int64_t first, int64_t count, float* grad, float* loss,
               v8* z, v8* zt, v8* s, float* sc, Stream& stream) {
  const int64_t m = job.m, d = job.d, k = job.k;
  // z [kLanes clients][m] rows of features.
  for (int64_t c = 0; c < kLanes; ++c) {
    if (c < count) {
      const int64_t ahead = std::min(first + c + kAhead, job.n - 1);
      stream.limit = reinterpret_cast<const char*>(job.X + (ahead + 1) * m * d);
      __builtin_prefetch(job.y + ahead * m, 0, kLocality);
      __builtin_prefetch(job.heads + ahead * k, 1, kLocality);
      __builtin_prefetch(job.counts + ahead, 0, kLocality);
      features(job.X + (first + c) * m * d, job.B.data(), m, d, z + c * m, stream);
    }
    else for (int64_t j = 0; j < m; ++j) z[c * m + j] = v8{};
  }
  // zt [m][kLanes features]: lanes over clients; Gram entries and Z^T y.
  v8 G[kLanes][kLanes], b[kLanes];
  for (int64_t a = 0; a < k; ++a) {
    b[a] = v8{};
    for (int64_t c = a; c < k; ++c) G[a][c] = v8{};
  }
  v8 cnt = v8{} + 1.0f;
  for (int64_t c = 0; c < count; ++c) cnt[c] = job.counts[first + c];
  for (int64_t j = 0; j < m; ++j) {
    v8 rows[kLanes];
    for (int64_t c = 0; c < kLanes; ++c) rows[c] = z[c * m + j];
    transpose8(rows);
    v8 yj = v8{};
    for (int64_t c = 0; c < count; ++c) yj[c] = job.y[(first + c) * m + j];
    s[j] = yj;
    for (int64_t a = 0; a < k; ++a) {
      zt[j * kLanes + a] = rows[a];
      b[a] += rows[a] * yj;
      for (int64_t c = a; c < k; ++c) G[a][c] += rows[a] * rows[c];
    }
  }
  v8 trace = v8{};
  for (int64_t a = 0; a < k; ++a) trace += G[a][a];
  const v8 lam = 1e-6f * trace / static_cast<float>(k) + FLT_MIN;
  v8 L[kLanes][kLanes], t[kLanes], w[kLanes];
  for (int64_t c = 0; c < k; ++c) {
    v8 diag = G[c][c] + lam;
    for (int64_t p = 0; p < c; ++p) diag -= L[c][p] * L[c][p];
    L[c][c] = sqrt8(diag);
    for (int64_t r = c + 1; r < k; ++r) {
      v8 v = G[c][r];
      for (int64_t p = 0; p < c; ++p) v -= L[r][p] * L[c][p];
      L[r][c] = v / L[c][c];
    }
  }
  for (int64_t r = 0; r < k; ++r) {
    v8 v = b[r];
    for (int64_t p = 0; p < r; ++p) v -= L[r][p] * t[p];
    t[r] = v / L[r][r];
  }
  for (int64_t r = k - 1; r >= 0; --r) {
    v8 v = t[r];
    for (int64_t p = r + 1; p < k; ++p) v -= L[p][r] * w[p];
    w[r] = v / L[r][r];
  }
  v8 lossv = v8{};
  for (int64_t j = 0; j < m; ++j) {
    v8 r = -s[j];
    for (int64_t a = 0; a < k; ++a) r += zt[j * kLanes + a] * w[a];
    const v8 sj = r / cnt;
    lossv += r * sj;
    s[j] = sj;
  }
  for (int64_t c = 0; c < count; ++c) *loss += 0.5f * lossv[c];
  // Back to clients: the heads and, per client, g = X^T s, the gradient += w g^T.
  v8 wt[kLanes];
  for (int64_t a = 0; a < kLanes; ++a) wt[a] = a < k ? w[a] : v8{};
  transpose8(wt);
  for (int64_t c = 0; c < count; ++c) {
    float wc[kLanes];
    for (int64_t j = 0; j < m; ++j) sc[j] = s[j][c];
    for (int64_t a = 0; a < k; ++a) {
      wc[a] = wt[c][a];
      job.heads[(first + c) * k + a] = wc[a];
    }
    client_gradient(job.X + (first + c) * m * d, sc, wc, m, d, k, grad, stream);
  }
}

void run_chunk(Job& job, int64_t chunk) {
  const int64_t m = job.m, d = job.d, k = job.k;
  float* grad = job.partial.data() + chunk * (k * d + 1);
  float loss = 0.0f;
  std::vector<v8> z(kLanes * m), zt(m * kLanes), s(m);
  std::vector<float> sc(m);
  Stream stream{reinterpret_cast<const char*>(job.X + chunk * kChunk * m * d), nullptr};
  const int64_t end = std::min(job.n, (chunk + 1) * kChunk);
  for (int64_t i = chunk * kChunk; i < end; i += kLanes)
    run_group(job, i, std::min<int64_t>(kLanes, end - i), grad, &loss, z.data(), zt.data(),
              s.data(), sc.data(), stream);
  grad[k * d] = loss;
}

void work(Job& job) {
  for (int64_t c; (c = job.next.fetch_add(1)) < job.chunks;) {
    run_chunk(job, c);
    job.done.fetch_add(1, std::memory_order_release);
  }
}

ffi::Error FedRepFixedRound(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> X,
                           ffi::Buffer<ffi::F32> y, ffi::Buffer<ffi::F32> counts,
                           ffi::Buffer<ffi::F32> B, ffi::ResultBuffer<ffi::F32> heads,
                           ffi::ResultBuffer<ffi::F32> gradient,
                           ffi::ResultBuffer<ffi::F32> loss) {
  auto dims = X.dimensions();
  auto bdims = B.dimensions();
  if (dims.size() != 3 || bdims.size() != 2 || bdims[0] != dims[2] || bdims[1] > kLanes)
    return ffi::Error::InvalidArgument("fedrep_fixed_round: X [n, m, d], B [d, k <= 8]");
  auto job = std::make_shared<Job>();
  job->n = dims[0]; job->m = dims[1]; job->d = dims[2]; job->k = bdims[1];
  job->X = X.typed_data(); job->y = y.typed_data(); job->counts = counts.typed_data();
  job->heads = heads->typed_data();
  job->B.assign(job->d, v8{});
  for (int64_t l = 0; l < job->d; ++l)
    for (int64_t a = 0; a < job->k; ++a) job->B[l][a] = B.typed_data()[l * job->k + a];
  job->chunks = (job->n + kChunk - 1) / kChunk;
  const int64_t stride = job->k * job->d + 1;
  job->partial.assign(job->chunks * stride, 0.0f);
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), job->chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([job] { work(*job); });
  work(*job);
  while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
  float* out = gradient->typed_data();
  std::fill(out, out + stride - 1, 0.0f);
  float total = 0.0f;
  for (int64_t c = 0; c < job->chunks; ++c) {
    const float* p = job->partial.data() + c * stride;
    for (int64_t e = 0; e < stride - 1; ++e) out[e] += p[e];
    total += p[stride - 1];
  }
  *loss->typed_data() = total;
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(fedrep_fixed_round, FedRepFixedRound,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
