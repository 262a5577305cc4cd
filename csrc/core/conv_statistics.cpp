#include "core/conv_statistics.h"

#include <algorithm>

namespace fastpipe::conv {

size_t pick_engine(const std::vector<double>& fastest, const std::vector<double>& ratio) {
  size_t best = 0;
  for (size_t i = 1; i < fastest.size(); ++i) {
    const bool qualifies = fastest[i] * kSwitchMargin <= fastest[0] && ratio[i] * kSwitchMargin <= 1.0;
    if (qualifies && (best == 0 || ratio[i] < ratio[best])) best = i;
  }
  return best;
}

double quantile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  return lo + 1 < v.size() ? v[lo] + (at - lo) * (v[lo + 1] - v[lo]) : v[lo];
}

Margin margin_of(size_t chosen, const std::vector<size_t>& live, const std::vector<std::vector<double>>& ratios,
                 const std::vector<double>& ratio) {
  size_t runner_up = chosen;
  for (size_t i : live)
    if (i != chosen && (runner_up == chosen || ratio[i] < ratio[runner_up])) runner_up = i;
  std::vector<double> over(ratios[chosen].size());
  for (size_t r = 0; r < over.size(); ++r) over[r] = ratios[runner_up][r] / std::max(ratios[chosen][r], 1e-12);
  Margin m;
  m.vs_runner_up = quantile(over, 0.5);
  m.vs_eager = 1.0 / ratio[chosen];
  m.spread = (quantile(over, 0.75) - quantile(over, 0.25)) / 2 / m.vs_runner_up;
  return m;
}

}  // namespace fastpipe::conv
