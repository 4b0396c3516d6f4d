// W6's pair work on a CPU, two ways, one thread: what a cluster-pair kernel would give.
//
//   g++ -O2 -march=native -o /tmp/cluster_pairs benchmarks/native/cluster_pairs.cpp && /tmp/cluster_pairs 200
//
// W6's 64 periodic argon cells of 108 atoms (FCC a = 5.26 A, rattled 0.1 A, seed = cell), LJ with
// the 8.5125 A cutoff, lists to 9.5 A (alchemi's 1.0 A skin on a CPU), float32, each pair once
// (a half list), forces and energy:
//
// * atom lanes: each atom's neighbour entries (atom, periodic image) taken eight at a time, as
//   alchemi_potentials.pair_lanes does: gathers, the terms in fixed-length loops, the neighbours'
//   forces updated one pair at a time (Newton's third law).
// * clusters 4x4: atoms sorted by bin into clusters of four; each entry is a cluster of four
//   against a cluster of four (all sixteen pairs computed, those past the cutoff masked) in two
//   AVX2 registers; the neighbour cluster's positions load as one vector each and its forces are
//   summed in registers and stored once per entry. The price: every entry computes sixteen pairs
//   whether or not they lie within the cutoff.
//
// Prints both kernels' agreement (largest force difference, relative energy difference) and the
// milliseconds per step of all 64 cells, three alternating rounds. A measurement, not a part of
// alchemi: the lists here are built by brute force, once.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
using T = float;
static const T SIG = 3.405f, EPS = 0.0104f, RC = 2.5f * 3.405f, RL = RC + 1.0f;
static const T A4 = 4 * EPS, B2 = SIG * SIG, RC2 = RC * RC;
struct Sys { int n; T L; std::vector<T> x, y, z; };

static Sys make(int seed) {
  Sys s; const T a = 5.26f; s.L = 3 * a; int b[4][3] = {{0,0,0},{1,1,0},{1,0,1},{0,1,1}};
  std::mt19937 g(seed); std::normal_distribution<T> d(0, 0.1f);
  for (int i = 0; i < 3; i++) for (int j = 0; j < 3; j++) for (int k = 0; k < 3; k++) for (auto& q : b) {
    s.x.push_back(a * (i + 0.5f * q[0]) + d(g)); s.y.push_back(a * (j + 0.5f * q[1]) + d(g)); s.z.push_back(a * (k + 0.5f * q[2]) + d(g)); }
  s.n = s.x.size(); return s;
}
// ---------- atom lanes: per-atom half list, entries (j, image) ----------------------------------
struct AtomList { std::vector<int> start, j, img; };  // img = (mx+1)*9+(my+1)*3+(mz+1)
static bool owns(int i, int j, int mx, int my, int mz) {  // each unordered pair once
  if (i != j) return i < j;
  return (mx > 0) || (mx == 0 && (my > 0 || (my == 0 && mz > 0)));
}
static AtomList build_atom_list(const Sys& s) {
  AtomList l; l.start.push_back(0);
  for (int i = 0; i < s.n; i++) {
    for (int j = 0; j < s.n; j++) for (int mx = -1; mx <= 1; mx++) for (int my = -1; my <= 1; my++) for (int mz = -1; mz <= 1; mz++) {
      if (i == j && !mx && !my && !mz) continue;
      if (!owns(i, j, mx, my, mz)) continue;
      T dx = s.x[j] + mx * s.L - s.x[i], dy = s.y[j] + my * s.L - s.y[i], dz = s.z[j] + mz * s.L - s.z[i];
      if (dx * dx + dy * dy + dz * dz < RL * RL) { l.j.push_back(j); l.img.push_back((mx + 1) * 9 + (my + 1) * 3 + (mz + 1)); }
    }
    l.start.push_back(l.j.size());
  }
  return l;
}
static void forces_lanes(const Sys& s, const AtomList& l, T* fx, T* fy, T* fz, T& energy) {
  constexpr int L = 8;
  T sh[27][3];
  for (int q = 0; q < 27; q++) { sh[q][0] = (q / 9 - 1) * s.L; sh[q][1] = (q / 3 % 3 - 1) * s.L; sh[q][2] = (q % 3 - 1) * s.L; }
  T etot = 0;
  for (int i = 0; i < s.n; i++) {
    const int lo = l.start[i], n = l.start[i + 1] - lo;
    const T x0 = s.x[i], y0 = s.y[i], z0 = s.z[i];
    T se[L] = {}, sx[L] = {}, sy[L] = {}, sz[L] = {};
    for (int k0 = 0; k0 < n; k0 += L) {
      int u[L]; T dx[L], dy[L], dz[L], g[L], en[L];
      for (int q = 0; q < L; q++) {
        const int k = lo + (k0 + q < n ? k0 + q : n - 1);
        u[q] = l.j[k]; const int m = l.img[k];
        dx[q] = s.x[u[q]] + sh[m][0] - x0; dy[q] = s.y[u[q]] + sh[m][1] - y0; dz[q] = s.z[u[q]] + sh[m][2] - z0;
      }
      for (int q = 0; q < L; q++) {
        const T r2 = dx[q] * dx[q] + dy[q] * dy[q] + dz[q] * dz[q];
        const T inside = (r2 < RC2 && k0 + q < n) ? T(1) : T(0);
        const T inv = T(1) / r2, s2 = B2 * inv, s6 = s2 * s2 * s2;
        en[q] = inside * A4 * (s6 * s6 - s6); g[q] = inside * A4 * (T(6) * s6 - T(12) * s6 * s6) * inv;
      }
      for (int q = 0; q < L; q++) { se[q] += en[q]; sx[q] += g[q] * dx[q]; sy[q] += g[q] * dy[q]; sz[q] += g[q] * dz[q]; }
      for (int q = 0; q < L; q++) { fx[u[q]] -= g[q] * dx[q]; fy[u[q]] -= g[q] * dy[q]; fz[u[q]] -= g[q] * dz[q]; }
    }
    T e = 0, ax = 0, ay = 0, az = 0;
    for (int q = 0; q < L; q++) { e += se[q]; ax += sx[q]; ay += sy[q]; az += sz[q]; }
    fx[i] += ax; fy[i] += ay; fz[i] += az; etot += e;
  }
  energy = etot;
}
// ---------- clusters: 4-atom clusters against 4-atom clusters -------------------------------------
struct ClusterList { std::vector<int> order; std::vector<T> cx, cy, cz; std::vector<int> start, cj, img; int nc; };
static ClusterList build_cluster_list(const Sys& s) {
  ClusterList l; const int nb = 3;  // 3x3x3 bins of L/3, 4 atoms each for fcc: sort by bin, then group 4
  std::vector<int> idx(s.n); for (int i = 0; i < s.n; i++) idx[i] = i;
  auto bin = [&](int i) { auto w = [&](T v) { int b = int(std::floor(v / s.L * nb)); return ((b % nb) + nb) % nb; };
                          int bx = w(s.x[i]), by = w(s.y[i]), bz = w(s.z[i]); return (bx * nb + by) * nb + bz; };
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return bin(a) < bin(b); });
  l.order = idx; l.nc = (s.n + 3) / 4;
  l.cx.assign(l.nc * 4, 1e4f); l.cy.assign(l.nc * 4, 1e4f); l.cz.assign(l.nc * 4, 1e4f);  // padding far away
  for (int k = 0; k < s.n; k++) { l.cx[k] = s.x[idx[k]]; l.cy[k] = s.y[idx[k]]; l.cz[k] = s.z[idx[k]]; }
  l.start.push_back(0);
  for (int ci = 0; ci < l.nc; ci++) {
    for (int cj = ci; cj < l.nc; cj++) for (int mx = -1; mx <= 1; mx++) for (int my = -1; my <= 1; my++) for (int mz = -1; mz <= 1; mz++) {
      if (ci == cj && !((mx > 0) || (mx == 0 && (my > 0 || (my == 0 && mz >= 0))))) continue;  // self: one of +-image
      T best = 1e30f;  // closest atom pair of the two clusters (a bounding-box test in practice)
      for (int a = 0; a < 4; a++) for (int b = 0; b < 4; b++) {
        int ia = ci * 4 + a, jb = cj * 4 + b; if (ia >= s.n || jb >= s.n) continue;
        T dx = l.cx[jb] + mx * s.L - l.cx[ia], dy = l.cy[jb] + my * s.L - l.cy[ia], dz = l.cz[jb] + mz * s.L - l.cz[ia];
        best = std::min(best, dx * dx + dy * dy + dz * dz);
      }
      if (best < RL * RL) { l.cj.push_back(cj); l.img.push_back((mx + 1) * 9 + (my + 1) * 3 + (mz + 1)); }
    }
    l.start.push_back(l.cj.size());
  }
  return l;
}
#include <immintrin.h>
static inline float hsum128(__m128 v) { __m128 s = _mm_add_ps(v, _mm_movehl_ps(v, v)); s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1)); return _mm_cvtss_f32(s); }
// Eight of an entry's sixteen pairs (i atoms a, a + 1 against j atoms 0..3): g = U'(r)/r, the
// displacements, and the i atoms' forces and the energy accumulated.
static inline void half(__m256 jx, __m256 jy, __m256 jz, __m256 ix, __m256 iy, __m256 iz, bool self, __m256 self_mask,
                        __m256& g, __m256& dx, __m256& dy, __m256& dz, __m256& fx, __m256& fy, __m256& fz, __m256& etot) {
  const __m256 one = _mm256_set1_ps(1.f);
  dx = _mm256_sub_ps(jx, ix); dy = _mm256_sub_ps(jy, iy); dz = _mm256_sub_ps(jz, iz);
  const __m256 r2 = _mm256_fmadd_ps(dx, dx, _mm256_fmadd_ps(dy, dy, _mm256_mul_ps(dz, dz)));
  __m256 mask = _mm256_cmp_ps(r2, _mm256_set1_ps(RC2), _CMP_LT_OQ);
  if (self) mask = _mm256_and_ps(mask, _mm256_cmp_ps(self_mask, one, _CMP_EQ_OQ));  // a cluster with itself: j > i
  // Masked lanes divide by one (a self pair has r2 = 0), then count zero.
  const __m256 inv = _mm256_div_ps(one, _mm256_blendv_ps(one, r2, mask));
  const __m256 s2 = _mm256_mul_ps(_mm256_set1_ps(B2), inv), s6 = _mm256_mul_ps(_mm256_mul_ps(s2, s2), s2);
  const __m256 ai = _mm256_mul_ps(_mm256_set1_ps(A4), _mm256_and_ps(mask, one));
  etot = _mm256_fmadd_ps(ai, _mm256_fmsub_ps(s6, s6, s6), etot);
  const __m256 twelve_s12 = _mm256_mul_ps(_mm256_set1_ps(12.f), _mm256_mul_ps(s6, s6));
  g = _mm256_mul_ps(_mm256_mul_ps(ai, _mm256_fmsub_ps(_mm256_set1_ps(6.f), s6, twelve_s12)), inv);
  fx = _mm256_fmadd_ps(g, dx, fx); fy = _mm256_fmadd_ps(g, dy, fy); fz = _mm256_fmadd_ps(g, dz, fz);
}
static void forces_clusters(const Sys& s, const ClusterList& l, T* gx, T* gy, T* gz, T& energy) {
  // AVX2: an i cluster of 4 against a j cluster of 4 as two registers of 8 lanes,
  // lane = (i atom a in 0..1 or 2..3) * 4 + j atom b.
  alignas(32) T sh[27][3];
  for (int q = 0; q < 27; q++) { sh[q][0] = (q / 9 - 1) * s.L; sh[q][1] = (q / 3 % 3 - 1) * s.L; sh[q][2] = (q % 3 - 1) * s.L; }
  // self-cluster masks: keep j > i only (lane b > a)
  alignas(32) float selfm0[8], selfm1[8];
  for (int q = 0; q < 8; q++) { int a = q / 4, b = q % 4; selfm0[q] = b > a ? 1.f : 0.f; selfm1[q] = b > a + 2 ? 1.f : 0.f; }
  const __m256 sm0 = _mm256_load_ps(selfm0), sm1 = _mm256_load_ps(selfm1);
  __m256 etot = _mm256_setzero_ps();
  for (int ci = 0; ci < l.nc; ci++) {
    const T* px = &l.cx[ci * 4]; const T* py = &l.cy[ci * 4]; const T* pz = &l.cz[ci * 4];
    const __m256 ix0 = _mm256_setr_ps(px[0], px[0], px[0], px[0], px[1], px[1], px[1], px[1]);
    const __m256 ix1 = _mm256_setr_ps(px[2], px[2], px[2], px[2], px[3], px[3], px[3], px[3]);
    const __m256 iy0 = _mm256_setr_ps(py[0], py[0], py[0], py[0], py[1], py[1], py[1], py[1]);
    const __m256 iy1 = _mm256_setr_ps(py[2], py[2], py[2], py[2], py[3], py[3], py[3], py[3]);
    const __m256 iz0 = _mm256_setr_ps(pz[0], pz[0], pz[0], pz[0], pz[1], pz[1], pz[1], pz[1]);
    const __m256 iz1 = _mm256_setr_ps(pz[2], pz[2], pz[2], pz[2], pz[3], pz[3], pz[3], pz[3]);
    __m256 fx0 = _mm256_setzero_ps(), fy0 = fx0, fz0 = fx0, fx1 = fx0, fy1 = fx0, fz1 = fx0;
    for (int k = l.start[ci]; k < l.start[ci + 1]; k++) {
      const int cj = l.cj[k], m = l.img[k];
      const __m256 jx = _mm256_add_ps(_mm256_broadcast_ps((const __m128*)&l.cx[cj * 4]), _mm256_set1_ps(sh[m][0]));
      const __m256 jy = _mm256_add_ps(_mm256_broadcast_ps((const __m128*)&l.cy[cj * 4]), _mm256_set1_ps(sh[m][1]));
      const __m256 jz = _mm256_add_ps(_mm256_broadcast_ps((const __m128*)&l.cz[cj * 4]), _mm256_set1_ps(sh[m][2]));
      const bool self = cj == ci && m == 13;
      __m256 g0, g1, dx0, dy0, dz0, dx1, dy1, dz1;
      half(jx, jy, jz, ix0, iy0, iz0, self, sm0, g0, dx0, dy0, dz0, fx0, fy0, fz0, etot);
      half(jx, jy, jz, ix1, iy1, iz1, self, sm1, g1, dx1, dy1, dz1, fx1, fy1, fz1, etot);
      // j forces: sum the four i atoms (two registers, two halves) for each j lane
      __m256 tx = _mm256_fmadd_ps(g0, dx0, _mm256_mul_ps(g1, dx1));
      __m256 ty = _mm256_fmadd_ps(g0, dy0, _mm256_mul_ps(g1, dy1));
      __m256 tz = _mm256_fmadd_ps(g0, dz0, _mm256_mul_ps(g1, dz1));
      __m128 sx = _mm_add_ps(_mm256_castps256_ps128(tx), _mm256_extractf128_ps(tx, 1));
      __m128 sy = _mm_add_ps(_mm256_castps256_ps128(ty), _mm256_extractf128_ps(ty, 1));
      __m128 sz = _mm_add_ps(_mm256_castps256_ps128(tz), _mm256_extractf128_ps(tz, 1));
      _mm_storeu_ps(&gx[cj * 4], _mm_sub_ps(_mm_loadu_ps(&gx[cj * 4]), sx));
      _mm_storeu_ps(&gy[cj * 4], _mm_sub_ps(_mm_loadu_ps(&gy[cj * 4]), sy));
      _mm_storeu_ps(&gz[cj * 4], _mm_sub_ps(_mm_loadu_ps(&gz[cj * 4]), sz));
    }
    // i forces: each i atom's four lanes
    alignas(32) float bx0[8], bx1[8], by0[8], by1[8], bz0[8], bz1[8];
    _mm256_store_ps(bx0, fx0); _mm256_store_ps(bx1, fx1); _mm256_store_ps(by0, fy0); _mm256_store_ps(by1, fy1); _mm256_store_ps(bz0, fz0); _mm256_store_ps(bz1, fz1);
    for (int a = 0; a < 2; a++) {
      gx[ci * 4 + a] += hsum128(_mm_load_ps(bx0 + 4 * a)); gy[ci * 4 + a] += hsum128(_mm_load_ps(by0 + 4 * a)); gz[ci * 4 + a] += hsum128(_mm_load_ps(bz0 + 4 * a));
      gx[ci * 4 + 2 + a] += hsum128(_mm_load_ps(bx1 + 4 * a)); gy[ci * 4 + 2 + a] += hsum128(_mm_load_ps(by1 + 4 * a)); gz[ci * 4 + 2 + a] += hsum128(_mm_load_ps(bz1 + 4 * a));
    }
  }
  alignas(32) float e8[8]; _mm256_store_ps(e8, etot); T e = 0; for (int q = 0; q < 8; q++) e += e8[q];
  energy = e;
}
// The larger of two differences, a NaN winning (so a kernel that makes NaNs cannot look right).
static double worst(double old, double v) { return (v != v || v > old) ? v : old; }
int main(int argc, char** argv) {
  const int S = 64, reps = argc > 1 ? atoi(argv[1]) : 200;
  std::vector<Sys> sys; std::vector<AtomList> la; std::vector<ClusterList> lb;
  long pa = 0, pb = 0;
  for (int k = 0; k < S; k++) { sys.push_back(make(k)); la.push_back(build_atom_list(sys[k])); lb.push_back(build_cluster_list(sys[k])); pa += la[k].j.size(); pb += lb[k].cj.size() * 16; }
  const int N = sys[0].n, P = 4 * lb[0].nc;  // atoms per cell; slots per cell in cluster order (padded to fours)
  std::vector<T> fa(3 * N), fb(3 * P); double maxdiff = 0, ediff = 0;
  auto lanes = [&](int k, T& e) { std::fill(fa.begin(), fa.end(), 0); forces_lanes(sys[k], la[k], fa.data(), fa.data() + N, fa.data() + 2 * N, e); };
  auto clusters = [&](int k, T& e) { std::fill(fb.begin(), fb.end(), 0); forces_clusters(sys[k], lb[k], fb.data(), fb.data() + P, fb.data() + 2 * P, e); };
  for (int k = 0; k < S; k++) {  // agreement
    T ea, eb; lanes(k, ea); clusters(k, eb);
    for (int c = 0; c < N; c++) { int i = lb[k].order[c];
      for (int d = 0; d < 3; d++) maxdiff = worst(maxdiff, std::fabs(fa[d * N + i] - fb[d * P + c])); }
    ediff = worst(ediff, std::fabs(ea - eb) / std::fabs(ea));
  }
  printf("pairs computed per atom: atom lanes %.1f, clusters %.1f; largest |dF| %.2e eV/A, relative dE %.2e\n", pa / double(S * N), pb / double(S * N), maxdiff, ediff);
  for (int round = 0; round < 3; round++) {
    for (int which = 0; which < 2; which++) {
      auto t0 = std::chrono::steady_clock::now(); T sink = 0;
      for (int r = 0; r < reps; r++) for (int k = 0; k < S; k++) { T e; if (which == 0) lanes(k, e); else clusters(k, e); sink += e; }
      double ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3 / reps;
      // The energies are printed (as nothing) through sink, so the compiler cannot drop the work.
      printf("%s %.3f ms per step of %d systems (one thread)%s\n", which ? "clusters 4x4" : "atom lanes  ", ms, S, sink > 0 ? "" : " ");
    }
  }
}
