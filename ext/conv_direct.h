// Shared machinery of the direct convolution kernels (conv_direct.cpp,
// conv_direct_filter.cpp): 32-byte vectors through GCC/Clang vector
// extensions, lane ranges and masks for the borders, the register-block inner
// loop, flat planes, and the run-time dispatch between the baseline ISA and
// AVX2. Everything lives in an anonymous namespace: each kernel file gets its
// own copy, and nothing here is part of the module's interface.
#pragma once

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "kernels.h"
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define MINIDNN_X86_DISPATCH 1
#endif
#define MINIDNN_INLINE inline __attribute__((always_inline))
// Loops over register blocks must unroll fully, or the accumulators go to memory.
#if defined(__clang__)
#define MINIDNN_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define MINIDNN_UNROLL _Pragma("GCC unroll 16")
#else
#define MINIDNN_UNROLL
#endif
// GCC cannot see that lanes set one by one after a zero-init are initialised.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace minidnn {
namespace {


// 32-byte vectors (one AVX register, two SSE registers).
template <typename T>
struct Simd;
template <>
struct Simd<float> {
    typedef float V __attribute__((vector_size(32)));
    typedef float U __attribute__((vector_size(32), aligned(4), may_alias));  // unaligned
    typedef std::int32_t I;
    typedef I M __attribute__((vector_size(32)));
    static constexpr int L = 8;
};
template <>
struct Simd<double> {
    typedef double V __attribute__((vector_size(32)));
    typedef double U __attribute__((vector_size(32), aligned(8), may_alias));  // unaligned
    typedef std::int64_t I;
    typedef I M __attribute__((vector_size(32)));
    static constexpr int L = 4;
};

constexpr index_t kMaxKw = 32;       // taps per row kept in per-block tables
constexpr index_t kFlatMaxRow = 32;  // rows up to this wide run as flat planes

struct ConvGeom {
    index_t N, C, H, W, O, G, Cg, Og, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
    index_t K() const { return kh * kw; }
};

template <typename T>
struct Args {
    ConvGeom g;
    const T* a;     // the input read with vector loads (x, or gy for backward-data)
    const T* a_end; // one past its last element: vector loads never cross [a, a_end)
    const T* b;     // second operand (w, or gy for backward-filter)
    const T* bias;  // forward only, may be null
    T* out;
    bool flat;      // stride 1 and OW == W: planes run as one long row (see FlatLanes)
    // backward-filter on flat planes: per (block of L outputs, tap) the input
    // lane mask and its FlatLanes::mask code, per block the in-plane lanes
    const typename Simd<T>::M* masks = nullptr;
    const signed char* valid = nullptr;
    const typename Simd<T>::M* tails = nullptr;
};

// A small aligned array (std::vector would drop the vector types' alignment).
template <typename E>
struct AlignedArray {
    E* p;
    explicit AlignedArray(index_t n)
        : p(static_cast<E*>(::operator new(sizeof(E) * static_cast<size_t>(std::max<index_t>(n, 1)),
                                           std::align_val_t(64)))) {}
    ~AlignedArray() { ::operator delete(p, std::align_val_t(64)); }
    AlignedArray(const AlignedArray&) = delete;
    AlignedArray& operator=(const AlignedArray&) = delete;
};

// Lanes [l0, l1) of a row of `lanes` lanes whose source index base + l*s lies in [0, lim).
MINIDNN_INLINE void lane_range(index_t base, index_t s, index_t lim, index_t lanes, index_t* l0,
                               index_t* l1) {
    index_t lo, hi;
    if (s == 1) {  // the common cases without a division (this runs per vector)
        lo = base >= 0 ? 0 : -base;
        hi = lim - base;
    } else if (s == 2) {
        lo = base >= 0 ? 0 : (-base + 1) >> 1;
        hi = base >= lim ? 0 : (lim - base + 1) >> 1;
    } else {
        lo = base >= 0 ? 0 : (-base + s - 1) / s;
        hi = base >= lim ? 0 : (lim - base + s - 1) / s;
    }
    *l0 = std::min(lo, lanes);
    *l1 = std::max(*l0, std::min(hi, lanes));
}

// The even lanes of two consecutive vectors: a stride-2 load in two loads and a shuffle.
template <typename T>
MINIDNN_INLINE void even_lanes(const T* p, typename Simd<T>::V* v) {
    using S = Simd<T>;
    const typename S::V a = *reinterpret_cast<const typename S::U*>(p);
    const typename S::V b = *reinterpret_cast<const typename S::U*>(p + S::L);
#if defined(__clang__)
    if constexpr (S::L == 8)
        *v = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
    else
        *v = __builtin_shufflevector(a, b, 0, 2, 4, 6);
#else
    if constexpr (S::L == 8)
        *v = __builtin_shuffle(a, b, typename S::M{0, 2, 4, 6, 8, 10, 12, 14});
    else
        *v = __builtin_shuffle(a, b, typename S::M{0, 2, 4, 6});
#endif
}

// Loads R vectors of p[l*s], lanes l in [0, R*L), zero outside [l0, l1).
// MODE 0: every lane valid, s == 1 (plain loads); 1: every lane valid (gather);
// 2: s == 1 and the whole span readable (masked loads); 3: gather of [l0, l1);
// 4: every lane valid, s == 2 and p[0, 2*R*L) readable (shuffled loads);
// 5: s == 2 and p[0, 2*R*L) readable (shuffled, masked loads);
// 6: s == 1, the lanes of `mask` only, one by one.
template <typename T, int R, int MODE>
MINIDNN_INLINE void load_lanes(const T* p, index_t s, index_t l0, index_t l1,
                               const typename Simd<T>::M* mask, typename Simd<T>::V* v) {
    using S = Simd<T>;
    using U = typename S::U;
    if (MODE == 0) {
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) v[r] = *reinterpret_cast<const U*>(p + r * S::L);
    } else if (MODE == 1) {
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) {
            v[r] = typename S::V{};
            for (int l = 0; l < S::L; ++l) v[r][l] = p[(r * S::L + l) * s];
        }
    } else if (MODE == 4) {
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) even_lanes<T>(p + 2 * r * S::L, &v[r]);
    } else if (MODE == 5) {
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) {
            even_lanes<T>(p + 2 * r * S::L, &v[r]);
            v[r] = reinterpret_cast<typename S::V>(reinterpret_cast<typename S::M>(v[r]) & mask[r]);
        }
    } else if (MODE == 6) {
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) {
            v[r] = typename S::V{};
            for (int l = 0; l < S::L; ++l)
                if (mask[r][l]) v[r][l] = p[r * S::L + l];
        }
    } else if (MODE == 2) {
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r)
            v[r] = reinterpret_cast<typename S::V>(
                reinterpret_cast<typename S::M>(*reinterpret_cast<const U*>(p + r * S::L)) & mask[r]);
    } else {
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) {
            v[r] = typename S::V{};
            for (int l = 0; l < S::L; ++l) {
                const index_t k = r * S::L + l;
                if (k >= l0 && k < l1) v[r][l] = p[k * s];
            }
        }
    }
}

template <typename T, int R>
MINIDNN_INLINE void make_mask(index_t l0, index_t l1, typename Simd<T>::M* m) {
    using S = Simd<T>;
    MINIDNN_UNROLL
    for (int r = 0; r < R; ++r) {
        typename S::M iota;
        for (int l = 0; l < S::L; ++l) iota[l] = r * S::L + l;
        m[r] = (iota >= static_cast<typename S::I>(l0)) & (iota < static_cast<typename S::I>(l1));
    }
}

// Whether [first, last) lies inside [lo, hi): a masked vector load may read it.
template <typename T>
MINIDNN_INLINE bool readable(const T* first, const T* last, const T* lo, const T* hi) {
    return reinterpret_cast<std::uintptr_t>(first) >= reinterpret_cast<std::uintptr_t>(lo) &&
           reinterpret_cast<std::uintptr_t>(last) <= reinterpret_cast<std::uintptr_t>(hi);
}

// One tap (i, j) of a register block, summed over `n` channels (or output
// channels) read at p + k*pstride with weights w[b][k*wstride]:
//   acc[b][r] += w[b][k*wstride] * p[k*pstride + lanes of r].
template <typename T, int B, int R, int MODE>
MINIDNN_INLINE void tap_block(const T* p, index_t pstride, index_t s, index_t n,
                              const T* const* w, index_t wstride, index_t l0, index_t l1,
                              const typename Simd<T>::M* mask, typename Simd<T>::V (&acc)[B][R]) {
    for (index_t k = 0; k < n; ++k) {
        typename Simd<T>::V v[R];
        load_lanes<T, R, MODE>(p + k * pstride, s, l0, l1, mask, v);
        MINIDNN_UNROLL
        for (int b = 0; b < B; ++b) {
            const T wv = w[b][k * wstride];
            MINIDNN_UNROLL
            for (int r = 0; r < R; ++r) acc[b][r] += wv * v[r];
        }
    }
}

// Runs tap_block in the cheapest mode for lanes [l0, l1) of a block of RL.
template <typename T, int B, int R>
MINIDNN_INLINE void tap(const T* p, index_t pstride, index_t s, index_t n, const T* const* w,
                        index_t wstride, index_t l0, index_t l1, const T* lo, const T* hi,
                        typename Simd<T>::V (&acc)[B][R]) {
    constexpr int RL = R * Simd<T>::L;
    if (l0 == 0 && l1 == RL) {
        if (s == 1)
            tap_block<T, B, R, 0>(p, pstride, s, n, w, wstride, l0, l1, nullptr, acc);
        else if (s == 2 && readable(p, p + (n - 1) * pstride + 2 * RL, lo, hi))
            tap_block<T, B, R, 4>(p, pstride, s, n, w, wstride, l0, l1, nullptr, acc);
        else
            tap_block<T, B, R, 1>(p, pstride, s, n, w, wstride, l0, l1, nullptr, acc);
    } else if (s == 1 && readable(p, p + (n - 1) * pstride + RL, lo, hi)) {
        typename Simd<T>::M mask[R];
        make_mask<T, R>(l0, l1, mask);
        tap_block<T, B, R, 2>(p, pstride, s, n, w, wstride, l0, l1, mask, acc);
    } else if (s == 2 && readable(p, p + (n - 1) * pstride + 2 * RL, lo, hi)) {
        typename Simd<T>::M mask[R];
        make_mask<T, R>(l0, l1, mask);
        tap_block<T, B, R, 5>(p, pstride, s, n, w, wstride, l0, l1, mask, acc);
    } else {
        tap_block<T, B, R, 3>(p, pstride, s, n, w, wstride, l0, l1, nullptr, acc);
    }
}

// ------------------------------------------------------------- flat planes
// For stride-1 convolutions whose rows keep their width (OW == W), a plane is
// one long row: lane p of the output reads p + dr*W + dc of the input, so
// vectors run across row ends and small planes (7x7, 4x4) fill every lane.
// A lane is valid when its (row + dr, col + dc) lies inside the image.
template <typename T, int R>
struct FlatLanes {
    using S = Simd<T>;
    typename S::M row[R], col[R];

    MINIDNN_INLINE void init(index_t p0, index_t lanes, index_t width) {
        index_t rw = p0 / width, cl = p0 % width;  // one division, then steps
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r)
            for (int l = 0; l < S::L; ++l) {
                const index_t k = r * S::L + l;
                row[r][l] = k < lanes ? static_cast<typename S::I>(rw) : -(1 << 30);
                col[r][l] = static_cast<typename S::I>(cl);
                if (++cl == width) cl = 0, ++rw;
            }
    }

    // Masks of the lanes inside [0, H) x [0, W) once shifted by (dr, dc);
    // returns 0 (none), 1 (some) or 2 (all).
    MINIDNN_INLINE int mask(index_t dr, index_t dc, index_t H, index_t W, typename S::M* m) const {
        using I = typename S::I;
        bool any = false, all = true;
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) {
            const typename S::M rr = row[r] + static_cast<I>(dr), cc = col[r] + static_cast<I>(dc);
            m[r] = (rr >= 0) & (rr < static_cast<I>(H)) & (cc >= 0) & (cc < static_cast<I>(W));
            for (int l = 0; l < S::L; ++l) {
                any = any || m[r][l];
                all = all && m[r][l];
            }
        }
        return all ? 2 : any ? 1 : 0;
    }
};

template <typename T, int B, int R>
MINIDNN_INLINE void tap_flat(const T* p, index_t pstride, index_t n, const T* const* w,
                             index_t wstride, const typename Simd<T>::M* mask, int valid,
                             const T* lo, const T* hi, typename Simd<T>::V (&acc)[B][R]) {
    constexpr int RL = R * Simd<T>::L;
    if (valid == 2)
        tap_block<T, B, R, 0>(p, pstride, 1, n, w, wstride, 0, RL, nullptr, acc);
    else if (readable(p, p + (n - 1) * pstride + RL, lo, hi))
        tap_block<T, B, R, 2>(p, pstride, 1, n, w, wstride, 0, RL, mask, acc);
    else
        tap_block<T, B, R, 6>(p, pstride, 1, n, w, wstride, 0, RL, mask, acc);
}

// Stores the first `lanes` lanes of R vectors.
template <typename T, int R>
MINIDNN_INLINE void store_lanes(T* dst, const typename Simd<T>::V* v, index_t lanes) {
    std::memcpy(dst, v, static_cast<size_t>(lanes) * sizeof(T));
}

// ----------------------------------------------------------------- dispatch
// The item loops are compiled for the baseline ISA and, on x86, for AVX2 (no
// FMA: same rounding), picked at run time.
template <typename T>
using RangeFn = void (*)(const Args<T>&, index_t, index_t);

template <typename T, typename Item>
void items_base(const Args<T>& a, index_t i0, index_t i1) {
    for (index_t i = i0; i < i1; ++i) Item::item(a, i);
}
#ifdef MINIDNN_X86_DISPATCH
template <typename T, typename Item>
__attribute__((target("avx2"))) void items_avx2(const Args<T>& a, index_t i0, index_t i1) {
    for (index_t i = i0; i < i1; ++i) Item::item(a, i);
}
bool have_avx2() {
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes;
}
#endif

template <typename T, typename Item>
RangeFn<T> pick() {
#ifdef MINIDNN_X86_DISPATCH
    if (have_avx2()) return items_avx2<T, Item>;
#endif
    return items_base<T, Item>;
}

// Static contiguous ranges of items, one per thread: every item is computed by
// exactly one thread, so the split does not change any result.
template <typename T>
void run_items(RangeFn<T> fn, const Args<T>& a, index_t items, double work_per_item) {
#ifdef _OPENMP
    const int nt = static_cast<int>(std::min<double>(
        std::min<index_t>(omp_get_max_threads(), items), 1.0 + work_per_item * items / 65536.0));
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        {
            const index_t t = omp_get_thread_num(), T_ = omp_get_num_threads();
            fn(a, items * t / T_, items * (t + 1) / T_);
        }
        return;
    }
#endif
    (void)work_per_item;
    fn(a, 0, items);
}

// Register blocking: B channels x R vectors. Wide rows take 4 x 2, narrow
// rows 8 x 1 (fewer idle lanes), one channel per group (depthwise) 1 x R.
template <typename T, template <typename, int, int> class Item>
RangeFn<T> pick_blocking(index_t row, index_t per_group, int* B, int* RL) {
    const bool wide = row > Simd<T>::L;
    *RL = (wide ? 2 : 1) * Simd<T>::L;
    if (per_group == 1) {
        *B = 1;
        return wide ? pick<T, Item<T, 1, 2>>() : pick<T, Item<T, 1, 1>>();
    }
    *B = wide ? 4 : 8;
    return wide ? pick<T, Item<T, 4, 2>>() : pick<T, Item<T, 8, 1>>();
}

// Flat planes pay a mask per vector but fill every lane: worth it for narrow rows.
bool use_flat(const ConvGeom& g) {
    return g.sh == 1 && g.sw == 1 && g.OW == g.W && g.OW <= kFlatMaxRow;
}

// Validates x (N, C, H, W), w (O, C/groups, kh, kw) and y (N, O, OH, OW).
ConvGeom conv_geom(const py::array& x, const py::array& w, const py::array& y, index_t sh,
                   index_t sw, index_t ph, index_t pw, index_t dh, index_t dw, index_t groups,
                   const char* xn, const char* yn) {
    require(x.ndim() == 4, std::string("argument '") + xn + "' must be 4-D (N, C, H, W), got shape " +
                               shape_str(x));
    require(w.ndim() == 4, "argument 'w' must be 4-D (O, C/groups, kh, kw), got shape " + shape_str(w));
    require(groups >= 1, "groups must be >= 1, got " + std::to_string(groups));
    ConvGeom g{};
    g.N = x.shape(0), g.C = x.shape(1), g.H = x.shape(2), g.W = x.shape(3);
    g.O = w.shape(0), g.kh = w.shape(2), g.kw = w.shape(3), g.G = groups;
    g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw, g.dh = dh, g.dw = dw;
    require(g.C % groups == 0 && g.O % groups == 0,
            "channels (" + std::to_string(g.C) + " in, " + std::to_string(g.O) +
                " out) must be divisible by groups " + std::to_string(groups));
    g.Cg = g.C / groups, g.Og = g.O / groups;
    check_shape(w, "w", {g.O, g.Cg, -1, -1});
    require(g.kw <= kMaxKw && g.kh <= kMaxKw,
            "direct convolution supports kernels up to " + std::to_string(kMaxKw) + "x" +
                std::to_string(kMaxKw) + ", got " + std::to_string(g.kh) + "x" + std::to_string(g.kw));
    window_out_size(g.H, g.W, g.kh, g.kw, sh, sw, ph, pw, dh, dw, &g.OH, &g.OW);
    check_shape(y, yn, {g.N, g.O, g.OH, g.OW});
    return g;
}

// The optional bias b (O,) added to y's channels, checked; null where b is None. The pointer stays
// valid while the caller holds b.
template <typename T>
const T* checked_bias(py::handle bo, index_t O, const py::array& y) {
    if (bo.is_none()) return nullptr;
    auto b = checked<T>(bo, "b", false);
    check_shape(b, "b", {O});
    check_no_overlap(b, "b", y, "y");
    return b.data();
}

}  // namespace
}  // namespace minidnn
