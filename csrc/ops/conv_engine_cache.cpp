// The engine cache's report and persistence: the cached choices as lines for people, and as text that
// fastpipe/nn/_engines.py keeps in a file so that the next run makes the same choices without timing,
// with the margin each was made by (a thin one is re-timed by the next run: core/choice_cache.h).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ops/conv_tuner.h"
#include "ops/conv_tuner_state.h"

namespace fastpipe::conv {

namespace {

int64_t device_type(c10::string_view device) {
  return static_cast<int64_t>(c10::Device(std::string(device)).type());
}

std::string key_text(const Key& key) {
  std::ostringstream s;
  for (size_t i = 0; i < key.size(); ++i) s << (i ? "," : "") << key[i];
  return s.str();
}

// What the report adds to a choice's line: where it comes from, its margin, and what later runs do with it.
std::string status(const Choice& c, bool persisted) {
  if (!c.timed) return " [eager alone: not timed, not saved]";
  const char* origins[] = {"timed here", "loaded from the cache file",
                           "re-timed here (thin when loaded), kept the loaded choice",
                           "re-timed here (thin when loaded), replacing the loaded choice"};
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(3);
  const Margin& m = c.margin;
  s << " [" << origins[static_cast<int>(c.origin)] << "; ";
  if (m.vs_runner_up == m.vs_runner_up) {  // not NaN
    s << "margin x" << m.vs_runner_up << " over the runner-up, x" << m.vs_eager << " over eager, spread ";
    s.precision(1);
    s << 100 * m.spread << "%";
  } else {
    s << "margin unknown (an older cache file)";
  }
  s << ", " << m.timings << (m.timings == 1 ? " timing; " : " timings; ");
  if (!is_thin(m)) {
    s << "wide";
    if (c.origin == Origin::kLoaded) {
      s << ": used untimed";
    } else if (persisted) {
      s << ": saved, later runs use it untimed";
    }
    if (!persisted) s << ", not saved (per process)";
  } else if (m.timings >= kMaxTimings) {
    s << "thin after " << m.timings << " timings: its engines are within noise of each other, kept untimed";
  } else if (c.retime) {
    s << "thin: re-timed at its first call";
  } else {
    s << "thin" << (persisted ? ": saved, the next run re-times it" : ", not saved (per process)");
  }
  return s.str() + "]";
}

// Margin fields as the cache file keeps them; an empty field (format 2) is an unknown margin. Written to
// round-trip (max_digits10): at 6 digits a margin such as 1.282499 came back as 1.2825 and its report,
// which prints 3 decimals, changed from 1.282 to 1.283 after a save and load.
std::string margin_text(const Margin& m) {
  std::ostringstream s;
  s.precision(std::numeric_limits<double>::max_digits10);
  s << "runner_up=" << m.vs_runner_up << " eager=" << m.vs_eager << " spread=" << m.spread << " timings=" << m.timings;
  return s.str();
}

Margin parse_margin(const std::string& text, const std::string& line) {
  Margin m;
  std::istringstream fields(text);
  std::string field;
  while (fields >> field) {
    const size_t eq = field.find('=');
    const std::string name = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    TORCH_CHECK(!value.empty() && *end == '\0', "engine choice '", line, "': margin field '", field,
                "' is not <name>=<number>");
    if (name == "runner_up") {
      m.vs_runner_up = v;
    } else if (name == "eager") {
      m.vs_eager = v;
    } else if (name == "spread") {
      m.spread = v;
    } else if (name == "timings") {
      TORCH_CHECK(v >= 1 && v == static_cast<int>(v), "engine choice '", line,
                  "': timings must be a positive integer, got ", value);
      m.timings = static_cast<int>(v);
    } else {
      TORCH_CHECK(false, "engine choice '", line, "': unknown margin field '", name, "'");
    }
  }
  return m;
}

}  // namespace

std::vector<std::string> engine_cache() {
  TunerState& st = tuner_state();
  const auto choices = st.choices.entries();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<std::string> lines;
  for (const auto& [key, choice] : choices)
    lines.push_back(choice.report + status(choice, st.persisted.count(key[0])));
  std::sort(lines.begin(), lines.end());
  return lines;
}

// "<key fields, comma-separated>\t<engine>\t<margin>\t<report>" per timed choice of `device` type's keys.
std::vector<std::string> engine_export(c10::string_view device) {
  const int64_t type = device_type(device);
  TunerState& st = tuner_state();
  std::vector<std::string> lines;
  for (const auto& [key, choice] : st.choices.entries()) {
    if (key[0] != type || !choice.timed) continue;
    const auto& cands = st.by_slot[slot(static_cast<c10::DeviceType>(type), key[1])]->candidates;
    lines.push_back(key_text(key) + '\t' + cands[choice.index].name + '\t' + margin_text(choice.margin) + '\t' +
                    choice.report);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

int64_t engine_import(std::vector<std::string> lines) {
  TunerState& st = tuner_state();
  int64_t added = 0;
  for (const std::string& line : lines) {
    size_t tab[3];
    tab[0] = line.find('\t');
    for (size_t i = 1; i < 3; ++i)
      tab[i] = tab[i - 1] == std::string::npos ? tab[i - 1] : line.find('\t', tab[i - 1] + 1);
    TORCH_CHECK(tab[2] != std::string::npos, "engine choice '", line,
                "' is not '<key>\\t<engine>\\t<margin>\\t<report>'");
    Key key{};
    std::istringstream fields(line.substr(0, tab[0]));
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
    const Margin margin = parse_margin(line.substr(tab[1] + 1, tab[2] - tab[1] - 1), line);
    // Engines of a device type this build lacks, or renamed since, are skipped: those keys are timed anew.
    if (key[0] < 0 || key[0] >= static_cast<int64_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES) ||
        (key[1] != 0 && key[1] != 1))
      continue;
    const DeviceCandidates* dev = st.by_slot[slot(static_cast<c10::DeviceType>(key[0]), key[1])];
    if (!dev) continue;
    const std::string name = line.substr(tab[0] + 1, tab[1] - tab[0] - 1);
    const auto& cands = dev->candidates;
    auto it = std::find_if(cands.begin(), cands.end(), [&](const Candidate& c) { return name == c.name; });
    if (it == cands.end()) continue;
    added += st.choices.import(key, static_cast<size_t>(it - cands.begin()), line.substr(tab[2] + 1), margin);
  }
  return added;
}

std::vector<std::string> engine_forget(c10::string_view device, bool thin_only) {
  const int64_t type = device_type(device);
  std::vector<std::string> keys;
  for (const Key& key : tuner_state().choices.forget([&](const Key& k, const Choice& c) {
         return k[0] == type && (!thin_only || (c.timed && is_thin(c.margin)));
       }))
    keys.push_back(key_text(key));
  std::sort(keys.begin(), keys.end());
  return keys;
}

bool engine_persist(c10::string_view device, bool on) {
  const int64_t type = device_type(device);
  TunerState& st = tuner_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  const bool was = st.persisted.count(type);
  if (on) {
    st.persisted.insert(type);
  } else {
    st.persisted.erase(type);
  }
  return was;
}

}  // namespace fastpipe::conv
