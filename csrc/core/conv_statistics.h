// The tuner's statistics over its timed rounds (torch-free, next to choice_cache.h, whose Margin they
// fill): which candidate wins, and by how much.
#pragma once

#include <cstddef>
#include <vector>

#include "core/choice_cache.h"

namespace fastpipe::conv {

constexpr double kSwitchMargin = 1.03;  // a candidate replaces eager only when at least 3% faster

// The choice from each candidate's fastest round and the median over rounds of its time divided by
// eager's in the same round ([0] is eager: ratio 1). A candidate replaces eager only when it is at least
// kSwitchMargin faster by both: a burst of load slows a round, not the median of paired ratios, so the
// same machine makes the same choice run after run; the fastest among those qualified wins.
size_t pick_engine(const std::vector<double>& fastest, const std::vector<double>& ratio);

// The p-quantile of v (0.5: the median), interpolated between neighbours.
double quantile(std::vector<double> v, double p);

// The margin of candidate `chosen` from the rounds' times relative to eager's: over the best of the other
// live candidates (paired by round, so that a burst slowing one round cancels out), and over eager.
Margin margin_of(size_t chosen, const std::vector<size_t>& live, const std::vector<std::vector<double>>& ratios,
                 const std::vector<double>& ratio);

}  // namespace fastpipe::conv
