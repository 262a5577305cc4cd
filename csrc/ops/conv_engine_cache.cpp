// The engine cache's report and persistence: the cached choices as lines for people, and as text that
// fastpipe/nn/_engines.py keeps in a file so that the next run makes the same choices without timing.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "ops/conv_tuner.h"
#include "ops/conv_tuner_state.h"

namespace fastpipe::conv {

std::vector<std::string> engine_cache() {
  TunerState& st = tuner_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<std::string> lines;
  for (const auto& [key, choice] : st.cache) lines.push_back(choice.report);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// "<key fields, comma-separated>\t<engine>\t<report>" per cached choice of `device` type's keys.
std::vector<std::string> engine_export(c10::string_view device) {
  const auto type = static_cast<int64_t>(c10::Device(std::string(device)).type());
  TunerState& st = tuner_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<std::string> lines;
  for (const auto& [key, choice] : st.cache) {
    if (key[0] != type || !choice.timed) continue;
    std::ostringstream s;
    for (size_t i = 0; i < key.size(); ++i) s << (i ? "," : "") << key[i];
    s << '\t' << st.devices.at(slot(static_cast<c10::DeviceType>(type), key[1])).candidates[choice.index].name << '\t'
      << choice.report;
    lines.push_back(s.str());
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

int64_t engine_import(std::vector<std::string> lines) {
  TunerState& st = tuner_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  int64_t added = 0;
  for (const std::string& line : lines) {
    const size_t tab1 = line.find('\t');
    const size_t tab2 = tab1 == std::string::npos ? tab1 : line.find('\t', tab1 + 1);
    TORCH_CHECK(tab2 != std::string::npos, "engine choice '", line, "' is not '<key>\\t<engine>\\t<report>'");
    Key key{};
    std::istringstream fields(line.substr(0, tab1));
    std::string field;
    size_t n = 0;
    while (std::getline(fields, field, ',')) {
      TORCH_CHECK(n < key.size(), "engine choice '", line, "' has more than ", key.size(), " key fields");
      size_t used = 0;
      try {
        key[n++] = std::stoll(field, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TORCH_CHECK(used == field.size() && !field.empty(), "engine choice '", line, "': key field '", field,
                  "' is not an integer");
    }
    TORCH_CHECK(n == key.size(), "engine choice '", line, "' has ", n, " key fields, expected ", key.size());
    // Engines of a device type this build lacks, or renamed since, are skipped: those keys are timed anew.
    if (key[0] < 0 || key[0] >= static_cast<int64_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES) ||
        (key[1] != 0 && key[1] != 1))
      continue;
    auto dev = st.devices.find(slot(static_cast<c10::DeviceType>(key[0]), key[1]));
    if (dev == st.devices.end()) continue;
    const std::string name = line.substr(tab1 + 1, tab2 - tab1 - 1);
    const auto& cands = dev->second.candidates;
    auto it = std::find_if(cands.begin(), cands.end(), [&](const Candidate& c) { return name == c.name; });
    if (it == cands.end()) continue;
    added += st.cache.emplace(key, Choice{static_cast<size_t>(it - cands.begin()), line.substr(tab2 + 1) + " [saved]", true})
                 .second;
  }
  return added;
}

}  // namespace fastpipe::conv
