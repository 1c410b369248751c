// Static offset assignment for the memory planner: greedy by size, best-fitting gap.
//
// The same rule as the planner's reference (minidnn/memory/placement.py):
// buffers are placed largest first (ties: earlier start, then lower index);
// each goes into the smallest gap, among the already placed buffers whose
// lifetimes overlap its own, that holds it, else above the highest of them.
// Placed buffers are kept in ascending offset order, so each query is one
// branch-light pass over them with no sorting: O(n^2) simple steps, which for
// the ~10^4-10^5 buffers of a deep network's program beats gathering the
// overlapping buffers and sorting them (most buffers overlap the long-lived ones).
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels.h"

namespace minidnn {

namespace {
const int64_t* int64_data(const py::object& o, const char* name, py::ssize_t n) {
    auto a = py::cast<py::array_t<int64_t, py::array::c_style>>(o);
    if (a.ndim() != 1 || a.shape(0) != n)
        throw py::value_error(std::string(name) + ": expected a 1-D int64 array of the buffers' length");
    return a.data();
}
}  // namespace

py::array_t<int64_t> place_buffers(py::object starts_o, py::object ends_o, py::object sizes_o,
                                   int64_t base) {
    auto starts_a = py::cast<py::array_t<int64_t, py::array::c_style>>(starts_o);
    if (starts_a.ndim() != 1) throw py::value_error("starts: expected a 1-D int64 array");
    const py::ssize_t n = starts_a.shape(0);
    const int64_t* start = starts_a.data();
    const int64_t* end = int64_data(ends_o, "ends", n);
    const int64_t* size = int64_data(sizes_o, "sizes", n);
    py::array_t<int64_t> result(n);
    int64_t* off = result.mutable_data();
    {
        py::gil_scoped_release nogil;
        int64_t last = 0;
        for (py::ssize_t i = 0; i < n; ++i) {
            if (start[i] < 0 || end[i] < start[i]) throw std::invalid_argument("bad lifetime");
            last = std::max(last, end[i]);
        }
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
            if (size[x] != size[y]) return size[x] > size[y];
            if (start[x] != start[y]) return start[x] < start[y];
            return x < y;
        });
        std::vector<int32_t> by_offset;   // placed buffers, ascending offset
        by_offset.reserve(n);
        for (int64_t id : order) {
            const int64_t a = start[id], b = end[id], sz = size[id];
            int64_t reach = base, best_gap = -1, best_at = -1;
            for (int32_t j : by_offset) {
                if (start[j] > b || end[j] < a) continue;   // never alive together
                const int64_t gap = off[j] - reach;
                if (gap >= sz && (best_gap < 0 || gap < best_gap)) best_gap = gap, best_at = reach;
                reach = std::max(reach, off[j] + size[j]);
            }
            off[id] = best_gap >= 0 ? best_at : reach;
            auto pos = std::upper_bound(by_offset.begin(), by_offset.end(), off[id],
                                        [&](int64_t o, int32_t j) { return o < off[j]; });
            by_offset.insert(pos, static_cast<int32_t>(id));
        }
    }
    return result;
}

}  // namespace minidnn
