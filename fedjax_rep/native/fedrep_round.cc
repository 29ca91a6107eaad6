// One FedRep round with exact heads on the CPU, as XLA FFI custom calls
// (fedjax_rep/native/fedrep_round.py), on fixed data (fedrep_fixed_round) or on fresh data
// drawn by the statistics sampler (fedrep_fresh_round).
//
// For client data X_i [m, d], y_i [m], counts_i real samples and B [d, k], k <= 8:
//   Z_i = X_i B,  w_i = (Z_i^T Z_i + lam_i I)^-1 Z_i^T y_i,
//   lam_i = 1e-6 trace(Z_i^T Z_i) / k + FLT_MIN,  r_i = Z_i w_i - y_i,
//   heads [n, k] = w,  gradient [k, d] = sum_i w_i (X_i^T r_i)^T / counts_i,
//   loss [] = sum_i ||r_i||^2 / (2 counts_i),
//   outside [k, k] = sum_i ||r_i / counts_i||^2 w_i w_i^T (fresh data only).
// fedrep_fixed_round reads X [n, m, d], y [n, m] and counts [n] from memory. fedrep_fresh_round
// draws client i's X_i = A_i [m, p] and y_i = A_i C* w_i* + noise_std e_i (counts_i = m) in
// the round's basis exactly as fresh_statistics.sample does: its m (p + 1) standard normals
// are the first of the transforms sqrt(2) erf_inv(u) of the two words of threefry2x32(k_i,
// (0, j)), k_i = fold_in(key, offset + i), j < h (h = half the draw rounded up to 16), the
// first words giving normals 0 .. h-1, the second h .. 2h-1; they are generated per group
// of clients in L1 and never stored.
//
// Z_i is computed per client with the k features in the lanes of a 256-bit register; the
// heads of 8 clients at a time are solved with the clients in the lanes (an unrolled
// Cholesky, no reduction across lanes); X_i^T r_i reads the client's rows again while they
// are in L1, 64 columns at a time in registers. On fixed data a prefetch stream, one cache
// line a step of those loops, brings in the data of the clients kAhead on. Chunks of kChunk
// clients run on XLA's intra-op thread pool and their sums are added in chunk order, so the
// result does not depend on the number of threads.
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
typedef uint32_t u8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
constexpr int kLanes = 8;        // k <= kLanes; clients per group
constexpr int kRows = 12;        // sample rows whose features are accumulated together
constexpr int64_t kChunk = 512;  // clients per unit of work (a multiple of kLanes)
constexpr int64_t kAhead = 4;    // clients whose data are prefetched ahead of the one in work
constexpr int kLocality = 3;     // __builtin_prefetch's: keep in all cache levels
constexpr int64_t kDraw = 16;    // a client's normals are drawn in multiples of this

struct Job {
  int64_t n, m, d, k, chunks;
  std::vector<v8> B;  // [d] rows of B, zero-padded to kLanes
  float* heads;       // [n, k] out
  // Fixed data (X null: fresh data).
  const float* X = nullptr;
  const float* y = nullptr;
  const float* counts = nullptr;
  // Fresh data: key, first client id, W* [n, k], rows of C* = Q^T B* [d] and the noise.
  uint32_t key[2] = {0, 0};
  uint32_t offset = 0;
  const float* heads_star = nullptr;
  std::vector<v8> B_star;
  float noise_std = 0.0f;
  int64_t draw = 0;  // normals drawn per client: m (d + 1) rounded up to kDraw
  std::vector<float> partial;  // [chunks, stride()]: gradient, loss and outside per chunk
  std::atomic<int64_t> next{0}, done{0};

  int64_t stride() const { return k * d + 1 + k * k; }
};

// The prefetch of the clients' fixed data ahead of the computation, one cache line a step.
// The steps are spread over the loops (one a column of the features, one a row of the
// gradient): a burst of prefetches at once stalls the core, and spread out they keep the
// memory busy while the core computes. Without a job (fresh data) it does nothing.
struct Stream {
  const Job* job = nullptr;
  const char* next = nullptr;   // the next line to prefetch
  const char* limit = nullptr;  // the end of the data of the client kAhead clients on

  void step() {
    if (next < limit) {
      __builtin_prefetch(next, 0, kLocality);
      next += 64;
    }
  }

  // Before client i's features: the stream runs on to the end of client i + kAhead's X,
  // whose y, head and count lines are prefetched now.
  void client(int64_t i) {
    if (job == nullptr) return;
    const int64_t ahead = std::min(i + kAhead, job->n - 1), m = job->m;
    limit = reinterpret_cast<const char*>(job->X + (ahead + 1) * m * job->d);
    __builtin_prefetch(job->y + ahead * m, 0, kLocality);
    __builtin_prefetch(job->heads + ahead * job->k, 1, kLocality);
    __builtin_prefetch(job->counts + ahead, 0, kLocality);
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

// A chunk's sums: the gradient [k, d] and, lanes over clients, the loss and outside[a][b].
struct Sums {
  float* grad;
  v8 loss = v8{};
  v8 outside[kLanes][kLanes] = {};
};

// Per-thread buffers of a chunk.
struct Scratch {
  std::vector<v8> z, zt, s;
  std::vector<float> sc, drawn, y;
  Scratch(const Job& job)
      : z(kLanes * job.m), zt(job.m * kLanes), s(job.m), sc(job.m),
        drawn(job.X ? 0 : kLanes * job.draw), y(job.X ? 0 : kLanes * job.m) {}
};

// The round of count <= kLanes clients, lanes over clients: client c's rows are
// X [c * x_stride:][m, d], its labels y [c * m:][m] and its real samples cnt[c]; their heads
// go to heads [count, k] and their sums into `sums` (outside only for fresh data).
void run_group(const Job& job, const float* X, int64_t x_stride, const float* y, v8 cnt,
               float* heads, int64_t count, Sums& sums, Scratch& scratch, Stream& stream,
               int64_t first) {
  const int64_t m = job.m, d = job.d, k = job.k;
  v8* z = scratch.z.data();
  v8* zt = scratch.zt.data();
  v8* s = scratch.s.data();
  // z [kLanes clients][m] rows of features.
  for (int64_t c = 0; c < kLanes; ++c) {
    if (c < count) {
      stream.client(first + c);
      features(X + c * x_stride, job.B.data(), m, d, z + c * m, stream);
    }
    else for (int64_t j = 0; j < m; ++j) z[c * m + j] = v8{};
  }
  // zt [m][kLanes features]: lanes over clients; Gram entries and Z^T y.
  v8 G[kLanes][kLanes], b[kLanes];
  for (int64_t a = 0; a < k; ++a) {
    b[a] = v8{};
    for (int64_t c = a; c < k; ++c) G[a][c] = v8{};
  }
  for (int64_t j = 0; j < m; ++j) {
    v8 rows[kLanes];
    for (int64_t c = 0; c < kLanes; ++c) rows[c] = z[c * m + j];
    transpose8(rows);
    v8 yj = v8{};
    for (int64_t c = 0; c < count; ++c) yj[c] = y[c * m + j];
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
  v8 lossv = v8{}, scaled = v8{};
  for (int64_t j = 0; j < m; ++j) {
    v8 r = -s[j];
    for (int64_t a = 0; a < k; ++a) r += zt[j * kLanes + a] * w[a];
    const v8 sj = r / cnt;
    lossv += r * sj;
    scaled += sj * sj;
    s[j] = sj;
  }
  for (int64_t c = count; c < kLanes; ++c) lossv[c] = 0.0f;
  sums.loss += 0.5f * lossv;
  if (job.X == nullptr)  // empty lanes have w = 0
    for (int64_t a = 0; a < k; ++a)
      for (int64_t c = a; c < k; ++c) sums.outside[a][c] += scaled * w[a] * w[c];
  // Back to clients: the heads and, per client, g = X^T s, the gradient += w g^T.
  v8 wt[kLanes];
  for (int64_t a = 0; a < kLanes; ++a) wt[a] = a < k ? w[a] : v8{};
  transpose8(wt);
  float* sc = scratch.sc.data();
  for (int64_t c = 0; c < count; ++c) {
    float wc[kLanes];
    for (int64_t j = 0; j < m; ++j) sc[j] = s[j][c];
    for (int64_t a = 0; a < k; ++a) {
      wc[a] = wt[c][a];
      heads[c * k + a] = wc[a];
    }
    client_gradient(X + c * x_stride, sc, wc, m, d, k, sums.grad, stream);
  }
}

// x rotated left by R bits, lane-wise; by whole bytes as one byte shuffle (AVX2 has no
// rotation: two shifts and an or otherwise).
template <int R>
inline u8 rotate_left(u8 x) {
  if constexpr (R % 8 == 0) {
    typedef uint8_t bytes __attribute__((vector_size(32)));
    bytes order;
    for (int i = 0; i < 32; ++i) order[i] = static_cast<uint8_t>((i & ~3) | ((i - R / 8) & 3));
    return (u8)__builtin_shuffle((bytes)x, order);
  } else {
    return (x << R) | (x >> (32 - R));
  }
}

template <int R>
inline void mix(u8& x1, u8& x2) {
  x1 += x2;
  x2 = rotate_left<R>(x2) ^ x1;
}

// The Threefry-2x32 hash (20 rounds) of 8 counters (x1, x2) under key (k1, k2), in place.
inline void threefry2x32(uint32_t k1, uint32_t k2, u8& x1, u8& x2) {
  const uint32_t keys[3] = {k1, k2, k1 ^ k2 ^ 0x1BD11BDAu};
  x1 += keys[0];
  x2 += keys[1];
  for (int step = 0; step < 5; ++step) {
    if (step % 2 == 0) {
      mix<13>(x1, x2); mix<15>(x1, x2); mix<26>(x1, x2); mix<6>(x1, x2);
    } else {
      mix<17>(x1, x2); mix<29>(x1, x2); mix<16>(x1, x2); mix<24>(x1, x2);
    }
    x1 += keys[(step + 1) % 3];
    x2 += keys[(step + 2) % 3] + static_cast<uint32_t>(step + 1);
  }
}

inline bool is_zero(u8 x) {
#if defined(__AVX__)
  return _mm256_testz_si256((__m256i)x, (__m256i)x);
#else
  for (int i = 0; i < kLanes; ++i)
    if (x[i]) return false;
  return true;
#endif
}

// Lane-wise mask ? if_true : if_false (mask lanes all ones or all zeros).
inline v8 select(u8 mask, v8 if_true, v8 if_false) {
  return (v8)((mask & (u8)if_true) | (~mask & (u8)if_false));
}

// Horner's rule: sum_i c[i] x^(N-1-i).
template <size_t N>
inline v8 polynomial(const float (&c)[N], v8 x) {
  v8 p = v8{} + c[0];
  for (size_t i = 1; i < N; ++i) p = p * x + c[i];
  return p;
}

// log(x) for x > 0 normal (Cephes' logf: x = 2^e (1 + f), 1 + f in [sqrt(1/2), sqrt(2)),
// a polynomial in f), to about 1 ulp.
inline v8 log8(v8 x) {
  constexpr uint32_t kHalfSqrt2 = 0x3F3504F3u;  // the bits of sqrt(1/2)
  constexpr float kLog[9] = {7.0376836292e-2f, -1.1514610310e-1f, 1.1676998740e-1f,
                             -1.2420140846e-1f, 1.4249322787e-1f, -1.6668057665e-1f,
                             2.0000714765e-1f, -2.4999993993e-1f, 3.3333331174e-1f};
  const u8 shifted = (u8)x - kHalfSqrt2;
  const v8 e = __builtin_convertvector((i8)shifted >> 23, v8);
  const v8 f = (v8)((shifted & 0x007FFFFFu) + kHalfSqrt2) - 1.0f;
  const v8 z = f * f;
  const v8 r = f * z * polynomial(kLog, f) - 2.12194440e-4f * e - 0.5f * z;
  return f + r + 0.693359375f * e;
}

// sqrt(2) erf_inv(u) for u uniform made from the top 23 bits of `bits`, as
// jax.random.normal: u = max(low, (1.f - low) v + low), v in [0, 1), low = nextafter(-1, 0)
// (the max changes nothing: 1.f - low rounds to 2 and 2 v + low rounds to >= low); erf_inv as
// XLA's, Giles' polynomial in w - 2.5 for w = -log(1 - u^2) < 5, else in sqrt(w) - 3 (that
// one computed only where a lane needs it, |u| > 0.9966).
inline v8 normal8(u8 bits) {
  constexpr float kLow = -0x1.fffffep-1f;
  constexpr float kCentral[9] = {2.81022636e-08f, 3.43273939e-07f, -3.5233877e-06f,
                                 -4.39150654e-06f, 0.00021858087f, -0.00125372503f,
                                 -0.00417768164f, 0.246640727f, 1.50140941f};
  constexpr float kTail[9] = {-0.000200214257f, 0.000100950558f, 0.00134934322f,
                              -0.00367342844f, 0.00573950773f, -0.0076224613f,
                              0.00943887047f, 1.00167406f, 2.83297682f};
  const v8 v = (v8)((bits >> 9) | 0x3F800000u) - 1.0f;
  const v8 u = v * (1.0f - kLow) + kLow;
  const v8 w = -log8(1.0f - u * u);  // as XLA's -log1p(-u * u): 1 - u * u is exact near 1
  v8 p = polynomial(kCentral, w - 2.5f);
  const u8 tail = (u8)(w >= 5.0f);
  if (__builtin_expect(!is_zero(tail), 0))
    p = select(tail, polynomial(kTail, sqrt8(w) - 3.0f), p);
  return 1.41421356f * (p * u);
}

// A client's job.draw normals into out, as fresh_statistics.sample draws them with its key
// (k1, k2) = fold_in(key, id): sqrt(2) erf_inv of both words of the hashes of counters
// 0 .. half - 1, the first words' to out[:half], the second words' to out[half:]. The words
// are hashed first, then transformed in a loop of independent iterations that the core
// overlaps (the transform is a long chain of dependent multiply-adds).
void draw_normals(const Job& job, uint32_t k1, uint32_t k2, float* out) {
  const int64_t half = job.draw / 2;  // a multiple of 8
  for (int64_t j = 0; j < half; j += kLanes) {
    u8 x1 = u8{}, x2 = u8{0, 1, 2, 3, 4, 5, 6, 7} + static_cast<uint32_t>(j);
    threefry2x32(k1, k2, x1, x2);
    __builtin_memcpy(out + j, &x1, sizeof(x1));
    __builtin_memcpy(out + half + j, &x2, sizeof(x2));
  }
  for (int64_t j = 0; j < job.draw; j += kLanes) {
    u8 bits;
    __builtin_memcpy(&bits, out + j, sizeof(bits));
    const v8 normal = normal8(bits);
    __builtin_memcpy(out + j, &normal, sizeof(normal));
  }
}

// Fresh data of count clients from `first` into scratch: client c's A [m, d] at
// drawn[c * draw:] and y [m] at y[c * m:].
void draw_group(const Job& job, int64_t first, int64_t count, Scratch& scratch, Stream& stream) {
  const int64_t m = job.m, d = job.d, k = job.k;
  v8* z = scratch.z.data();
  u8 k1 = u8{}, k2 = u8{0, 1, 2, 3, 4, 5, 6, 7} + static_cast<uint32_t>(job.offset + first);
  threefry2x32(job.key[0], job.key[1], k1, k2);  // the clients' fold_in(key, id)
  for (int64_t c = 0; c < count; ++c) {
    float* A = scratch.drawn.data() + c * job.draw;
    draw_normals(job, k1[c], k2[c], A);
    features(A, job.B_star.data(), m, d, z, stream);
    v8 head = v8{};
    for (int64_t a = 0; a < k; ++a) head[a] = job.heads_star[(first + c) * k + a];
    for (int64_t j = 0; j < m; ++j) {
      const v8 zw = z[j] * head;
      float label = 0.0f;
      for (int64_t a = 0; a < k; ++a) label += zw[a];
      scratch.y[c * m + j] = label + job.noise_std * A[m * d + j];
    }
  }
}

void run_chunk(Job& job, int64_t chunk) {
  const int64_t m = job.m, d = job.d, k = job.k;
  Sums sums{job.partial.data() + chunk * job.stride()};
  Scratch scratch(job);
  Stream stream;
  if (job.X != nullptr)
    stream = Stream{&job, reinterpret_cast<const char*>(job.X + chunk * kChunk * m * d)};
  const int64_t end = std::min(job.n, (chunk + 1) * kChunk);
  for (int64_t i = chunk * kChunk; i < end; i += kLanes) {
    const int64_t count = std::min<int64_t>(kLanes, end - i);
    v8 cnt = v8{} + 1.0f;
    if (job.X != nullptr) {
      for (int64_t c = 0; c < count; ++c) cnt[c] = job.counts[i + c];
      run_group(job, job.X + i * m * d, m * d, job.y + i * m, cnt, job.heads + i * k, count,
                sums, scratch, stream, i);
    } else {
      draw_group(job, i, count, scratch, stream);
      run_group(job, scratch.drawn.data(), job.draw, scratch.y.data(), cnt + (m - 1.0f),
                job.heads + i * k, count, sums, scratch, stream, i);
    }
  }
  float* rest = sums.grad + k * d;
  rest[0] = 0.0f;
  for (int c = 0; c < kLanes; ++c) rest[0] += sums.loss[c];
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      const v8 v = sums.outside[std::min(a, b)][std::max(a, b)];
      float total = 0.0f;
      for (int c = 0; c < kLanes; ++c) total += v[c];
      rest[1 + a * k + b] = total;
    }
}

void work(Job& job) {
  for (int64_t c; (c = job.next.fetch_add(1)) < job.chunks;) {
    run_chunk(job, c);
    job.done.fetch_add(1, std::memory_order_release);
  }
}

// Runs the job's chunks on the pool and this thread; gradient [k, d], loss [] and outside
// [k, k] (may be null) are the sums of the chunks' in chunk order.
void run(ffi::ThreadPool& pool, std::shared_ptr<Job> job, float* gradient, float* loss,
         float* outside) {
  job->chunks = (job->n + kChunk - 1) / kChunk;
  const int64_t stride = job->stride(), size = job->k * job->d;
  job->partial.assign(job->chunks * stride, 0.0f);
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), job->chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([job] { work(*job); });
  work(*job);
  while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
  std::fill(gradient, gradient + size, 0.0f);
  *loss = 0.0f;
  if (outside != nullptr) std::fill(outside, outside + job->k * job->k, 0.0f);
  for (int64_t c = 0; c < job->chunks; ++c) {
    const float* p = job->partial.data() + c * stride;
    for (int64_t e = 0; e < size; ++e) gradient[e] += p[e];
    *loss += p[size];
    if (outside != nullptr)
      for (int64_t e = 0; e < job->k * job->k; ++e) outside[e] += p[size + 1 + e];
  }
}

// [rows] rows of the [rows, k] matrix M, zero-padded to kLanes.
std::vector<v8> padded_rows(const float* M, int64_t rows, int64_t k) {
  std::vector<v8> out(rows, v8{});
  for (int64_t l = 0; l < rows; ++l)
    for (int64_t a = 0; a < k; ++a) out[l][a] = M[l * k + a];
  return out;
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
  job->B = padded_rows(B.typed_data(), job->d, job->k);
  run(pool, job, gradient->typed_data(), loss->typed_data(), nullptr);
  return ffi::Error::Success();
}

ffi::Error FedRepFreshRound(ffi::ThreadPool pool, ffi::Buffer<ffi::U32> key,
                           ffi::Buffer<ffi::U32> offset, ffi::Buffer<ffi::F32> heads_star,
                           ffi::Buffer<ffi::F32> coords_star, ffi::Buffer<ffi::F32> coords,
                           ffi::Buffer<ffi::F32> noise_std, int64_t samples,
                           ffi::ResultBuffer<ffi::F32> heads,
                           ffi::ResultBuffer<ffi::F32> gradient,
                           ffi::ResultBuffer<ffi::F32> loss,
                           ffi::ResultBuffer<ffi::F32> outside) {
  auto hdims = heads_star.dimensions();
  auto cdims = coords.dimensions();
  if (key.element_count() != 2 || hdims.size() != 2 || cdims.size() != 2 ||
      cdims[1] != hdims[1] || hdims[1] > kLanes || samples < 1 ||
      coords_star.dimensions().size() != 2 || coords_star.dimensions()[0] != cdims[0] ||
      coords_star.dimensions()[1] != cdims[1])
    return ffi::Error::InvalidArgument(
        "fedrep_fresh_round: key [2], heads_star [n, k <= 8], coords and coords_star [p, k]");
  auto job = std::make_shared<Job>();
  job->n = hdims[0]; job->m = samples; job->d = cdims[0]; job->k = cdims[1];
  job->heads = heads->typed_data();
  job->B = padded_rows(coords.typed_data(), job->d, job->k);
  job->B_star = padded_rows(coords_star.typed_data(), job->d, job->k);
  job->key[0] = key.typed_data()[0]; job->key[1] = key.typed_data()[1];
  job->offset = *offset.typed_data();
  job->heads_star = heads_star.typed_data();
  job->noise_std = *noise_std.typed_data();
  job->draw = (samples * (job->d + 1) + kDraw - 1) / kDraw * kDraw;
  run(pool, job, gradient->typed_data(), loss->typed_data(), outside->typed_data());
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(fedrep_fresh_round, FedRepFreshRound,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("samples")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
