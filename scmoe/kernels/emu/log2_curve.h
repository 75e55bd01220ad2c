// A piecewise-linear curve in log2 of its argument, flat beyond its end points: the emulator's
// measured efficiency curves (Stack::small_gemm by GEMM size, GpuSpec::fused_attention by head_dim).
#pragma once

#include <cmath>
#include <vector>

namespace scmoe::emu {

// The curve through `points` (non-empty, keys increasing) at x > 0; key(p) and value(p) read a point.
template <class Point, class Key, class Value>
double log2_curve(const std::vector<Point>& points, double x, Key key, Value value) {
    if (x <= key(points.front())) return value(points.front());
    if (x >= key(points.back())) return value(points.back());
    std::size_t i = 1;
    while (key(points[i]) <= x) ++i;  // points[i - 1] <= x < points[i]: exact at a point
    const Point &lo = points[i - 1], &hi = points[i];
    const double t = (std::log2(x) - std::log2(key(lo))) / (std::log2(key(hi)) - std::log2(key(lo)));
    return value(lo) + t * (value(hi) - value(lo));
}

}  // namespace scmoe::emu
