// Static offset assignment for the memory planner: greedy by size, lowest gap that holds it.
//
// Buffers are placed in the order the caller gives (minidnn/memory/placement.py
// chooses it); each goes into the lowest gap, among the already placed buffers
// whose lifetimes overlap its own, that holds it, else above the highest of them.
// place_buffers_lowest chooses the order as it goes: next, always the buffer whose
// lowest gap is lowest (the caller's order breaks ties), found by a heap of each
// buffer's last known lowest gap (which placing others can only raise).
//
// Placed buffers are kept in ascending offset order (a buffer placed at the
// offset of others goes after them), so each query is one pass over them with
// no sorting. The ordered list is cut into blocks of consecutive buffers, each
// knowing the span of steps its buffers are alive in: a pass skips a block
// alive only outside the query's lifetime, which is most blocks (buffers placed
// near each other tend to live at nearby steps), and an insertion moves only
// its block's entries. A pass ends at the first gap that holds the buffer.
// O(n^2) at worst, like the plain list, but for the ~10^4-10^5 buffers of a
// deep network's program several times faster.
#include <algorithm>
#include <limits>
#include <numeric>
#include <queue>
#include <tuple>
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

struct Placed {
    int64_t offset, top, start, end;   // bytes [offset, top) over steps [start, end]
};

// A run of consecutive placed buffers (in offset order) and the steps they span.
struct Block {
    int64_t first, last;
    std::vector<Placed> items;

    explicit Block(std::vector<Placed> placed = {}) : items(std::move(placed)) { measure(); }
    void measure() {
        first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
        for (const Placed& p : items) first = std::min(first, p.start), last = std::max(last, p.end);
    }
};

constexpr size_t kBlock = 32;   // blocks hold kBlock to 2 * kBlock - 1 buffers (a lone first block fewer)

// Buffers placed so far, in ascending offset order.
class Placement {
  public:
    // The offset for a buffer of ``size`` bytes alive over steps [a, b]: the lowest gap that holds it
    // between placed buffers alive with it, else above the highest of them.
    int64_t fit(int64_t a, int64_t b, int64_t size, int64_t base) const {
        int64_t reach = base;
        for (const Block& block : blocks_) {
            if (block.first > b || block.last < a) continue;   // none of them alive with it
            for (const Placed& p : block.items) {
                if (p.start > b || p.end < a) continue;
                if (p.offset - reach >= size) return reach;
                reach = std::max(reach, p.top);
            }
        }
        return reach;
    }

    void insert(const Placed& p) {
        if (blocks_.empty()) blocks_.emplace_back();
        // the first block ending above p's offset (else the last), after any buffer at that offset
        auto at_offset = [](int64_t o, const Placed& q) { return o < q.offset; };
        auto block = std::upper_bound(blocks_.begin(), blocks_.end() - 1, p.offset,
                                      [](int64_t o, const Block& k) { return o < k.items.back().offset; });
        auto& items = block->items;
        items.insert(std::upper_bound(items.begin(), items.end(), p.offset, at_offset), p);
        block->first = std::min(block->first, p.start), block->last = std::max(block->last, p.end);
        if (items.size() == 2 * kBlock) {                       // split in two halves
            Block upper(std::vector<Placed>(items.begin() + kBlock, items.end()));
            items.resize(kBlock);
            block->measure();
            blocks_.insert(block + 1, std::move(upper));
        }
    }

  private:
    std::vector<Block> blocks_;
};
}  // namespace

py::array_t<int64_t> place_buffers(py::object starts_o, py::object ends_o, py::object sizes_o,
                                   py::object order_o, int64_t base) {
    auto starts_a = py::cast<py::array_t<int64_t, py::array::c_style>>(starts_o);
    if (starts_a.ndim() != 1) throw py::value_error("starts: expected a 1-D int64 array");
    const py::ssize_t n = starts_a.shape(0);
    const int64_t* start = starts_a.data();
    const int64_t* end = int64_data(ends_o, "ends", n);
    const int64_t* size = int64_data(sizes_o, "sizes", n);
    const int64_t* order = int64_data(order_o, "order", n);
    py::array_t<int64_t> result(n);
    int64_t* off = result.mutable_data();
    {
        py::gil_scoped_release nogil;
        std::vector<char> seen(n, 0);
        for (py::ssize_t i = 0; i < n; ++i) {
            if (start[i] < 0 || end[i] < start[i]) throw std::invalid_argument("bad lifetime");
            if (order[i] < 0 || order[i] >= n || seen[order[i]]++) throw std::invalid_argument("order: not a permutation");
        }
        Placement placed;
        for (py::ssize_t i = 0; i < n; ++i) {
            const int64_t id = order[i];
            off[id] = placed.fit(start[id], end[id], size[id], base);
            placed.insert(Placed{off[id], off[id] + size[id], start[id], end[id]});
        }
    }
    return result;
}


py::array_t<int64_t> place_buffers_lowest(py::object starts_o, py::object ends_o, py::object sizes_o,
                                          py::object order_o, int64_t base) {
    auto starts_a = py::cast<py::array_t<int64_t, py::array::c_style>>(starts_o);
    if (starts_a.ndim() != 1) throw py::value_error("starts: expected a 1-D int64 array");
    const py::ssize_t n = starts_a.shape(0);
    const int64_t* start = starts_a.data();
    const int64_t* end = int64_data(ends_o, "ends", n);
    const int64_t* size = int64_data(sizes_o, "sizes", n);
    const int64_t* order = int64_data(order_o, "order", n);
    py::array_t<int64_t> result(n);
    int64_t* off = result.mutable_data();
    {
        py::gil_scoped_release nogil;
        std::vector<char> seen(n, 0);
        for (py::ssize_t i = 0; i < n; ++i) {
            if (start[i] < 0 || end[i] < start[i]) throw std::invalid_argument("bad lifetime");
            if (order[i] < 0 || order[i] >= n || seen[order[i]]++) throw std::invalid_argument("order: not a permutation");
        }
        // (lowest fit, rank in ``order``, buffer): a buffer's lowest fit only rises as others are
        // placed, so a key popped and found unchanged is the least of all current fits
        using Key = std::tuple<int64_t, int64_t, int64_t>;
        std::priority_queue<Key, std::vector<Key>, std::greater<Key>> heap;
        for (py::ssize_t i = 0; i < n; ++i) heap.emplace(base, i, order[i]);
        Placement placed;
        while (!heap.empty()) {
            auto [was, rank, id] = heap.top();
            heap.pop();
            const int64_t at = placed.fit(start[id], end[id], size[id], base);
            if (at != was) {
                heap.emplace(at, rank, id);
                continue;
            }
            off[id] = at;
            placed.insert(Placed{at, at + size[id], start[id], end[id]});
        }
    }
    return result;
}

}  // namespace minidnn
