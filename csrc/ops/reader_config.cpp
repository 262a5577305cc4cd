#include "ops/reader_config.h"

#include <pybind11/stl.h>

#include <string>

#include "core/gather.h"

namespace py = pybind11;

namespace fastpipe {
namespace {

std::string described(py::handle v) {
  return std::string(py::str(py::type::handle_of(v).attr("__name__"))) + " " + std::string(py::repr(v));
}

// A bool, or a tensor or array of bools: ints to PyNumber_Index, never to an argument check.
bool bool_like(py::handle v) {
  if (PyBool_Check(v.ptr())) return true;
  if (!py::hasattr(v, "dtype")) return false;
  const std::string dtype = py::str(v.attr("dtype"));
  return dtype == "bool" || dtype == "torch.bool";
}

// An int (numpy's too, or a one-element integer tensor; never a bool) in [low, high]; None for the
// automatic default (one outside them).
template <typename T>
T int_from_py(py::handle v, const char* name, T init, T low, T high, const char* why) {
  if (v.is_none() && has_automatic(init, low, high)) return init;
  const auto value = py::reinterpret_steal<py::int_>(
      bool_like(v) || !PyIndex_Check(v.ptr()) ? nullptr : PyNumber_Index(v.ptr()));
  if (!value) {  // a float tensor's __index__ raises its own TypeError, which does not name the argument
    PyErr_Clear();
    throw py::type_error(std::string(name) + " must be an int, got " + described(v));
  }
  for (const bool below : {true, false}) {
    const py::int_ bound(below ? low : high);
    const int outside = PyObject_RichCompareBool(value.ptr(), bound.ptr(), below ? Py_LT : Py_GT);
    if (outside < 0) throw py::error_already_set();
    if (outside)
      throw py::value_error(out_of_range_message(name, below, py::repr(bound), why, py::repr(value)));
  }
  return value.cast<T>();
}

template <typename E>
E choice_from_py(py::handle v, const char* name) {
  if (!py::isinstance<py::str>(v))
    throw py::type_error(std::string(name) + " must be one of " + choice_list<E>() + ", got " + described(v));
  return parse_choice<E>(name, v.cast<std::string>());
}

// Sets the field `key` from `value`; false when there is no such field.
bool set_field(ReaderConfig& c, const std::string& key, py::handle value) {
#define FASTPIPE_SET_INT(type, name, init, low, high, why)                                                   \
  if (key == #name) {                                                                                         \
    c.name = int_from_py<type>(value, #name, static_cast<type>(init), static_cast<type>(low),                 \
                               static_cast<type>(high), why);                                                 \
    return true;                                                                                              \
  }
#define FASTPIPE_SET_CHOICE(type, name, init) \
  if (key == #name) {                         \
    c.name = choice_from_py<type>(value, #name); \
    return true;                              \
  }
  FASTPIPE_READER_CONFIG(FASTPIPE_SET_INT, FASTPIPE_SET_CHOICE)
#undef FASTPIPE_SET_INT
#undef FASTPIPE_SET_CHOICE
  return false;
}

py::object get_field(const ReaderConfig& c, const std::string& key) {
#define FASTPIPE_GET_INT(type, name, init, low, high, why)                                                   \
  if (key == #name) {                                                                                         \
    const auto d = static_cast<type>(init);                                                                   \
    if (c.name == d && has_automatic(d, static_cast<type>(low), static_cast<type>(high))) return py::none(); \
    return py::int_(c.name);                                                                                  \
  }
#define FASTPIPE_GET_CHOICE(type, name, init) \
  if (key == #name) return py::str(choice_name(c.name));
  FASTPIPE_READER_CONFIG(FASTPIPE_GET_INT, FASTPIPE_GET_CHOICE)
#undef FASTPIPE_GET_INT
#undef FASTPIPE_GET_CHOICE
  throw py::attribute_error(key);
}

template <typename T>
py::object stat_to_py(const T& v) {
  return py::cast(v);
}
template <typename T>
py::object stat_to_py(const std::optional<T>& v) {
  return v ? py::cast(*v) : py::none();
}

}  // namespace

py::dict stats_dict(const ReaderStats& reader, const DeviceStats* device) {
  py::dict d;
#define FASTPIPE_STAT(type, name) d[#name] = stat_to_py(reader.name);
  FASTPIPE_READER_STATS(FASTPIPE_STAT)
#undef FASTPIPE_STAT
  if (device) {
#define FASTPIPE_STAT(type, name) d[#name] = stat_to_py(device->name);
    FASTPIPE_DEVICE_STATS(FASTPIPE_STAT)
#undef FASTPIPE_STAT
  }
  return d;
}

void bind_reader_config(py::module& m) {
  py::list fields, reader_stats, device_stats;
  py::dict choices;
#define FASTPIPE_NAME_INT(type, name, ...) fields.append(#name);
#define FASTPIPE_NAME_CHOICE(type, name, init) \
  fields.append(#name);                        \
  choices[#name] = choice_names<type>();
  FASTPIPE_READER_CONFIG(FASTPIPE_NAME_INT, FASTPIPE_NAME_CHOICE)
#undef FASTPIPE_NAME_INT
#undef FASTPIPE_NAME_CHOICE
#define FASTPIPE_NAME(type, name) reader_stats.append(#name);
  FASTPIPE_READER_STATS(FASTPIPE_NAME)
#undef FASTPIPE_NAME
#define FASTPIPE_NAME(type, name) device_stats.append(#name);
  FASTPIPE_DEVICE_STATS(FASTPIPE_NAME)
#undef FASTPIPE_NAME

  py::class_<ReaderConfig> cls(m, "ReaderConfig", R"(The reader's settings: the Loader's arguments of the same names.

ReaderConfig(**settings): every setting not given keeps its default. Each is checked when set: a wrong
type is a TypeError and a wrong value a ValueError, naming the setting. ``fields`` lists the settings,
``choices`` the names each string setting takes.)");
  cls.def(py::init([](const py::kwargs& settings) {
    ReaderConfig c;
    for (const auto& item : settings) {
      const auto key = item.first.cast<std::string>();
      if (!set_field(c, key, item.second)) throw py::type_error("ReaderConfig has no setting '" + key + "'");
    }
    return c;
  }));
  for (const auto& name : fields) {
    const auto key = name.cast<std::string>();
    cls.def_property(
        key.c_str(), [key](const ReaderConfig& c) { return get_field(c, key); },
        [key](ReaderConfig& c, py::handle v) { set_field(c, key, v); });
  }
  cls.def("__repr__", [fields](const ReaderConfig& c) {
    std::string s = "ReaderConfig(";
    for (const auto& name : fields) {
      const auto key = name.cast<std::string>();
      s += (s.back() == '(' ? "" : ", ") + key + "=" + std::string(py::repr(get_field(c, key)));
    }
    return s + ")";
  });
  cls.attr("fields") = py::tuple(fields);
  cls.attr("choices") = choices;
  m.attr("READER_STATS") = py::tuple(reader_stats);
  m.attr("DEVICE_STATS") = py::tuple(device_stats);

  // The reader's policies (core/gather.h), for tests on figures no test machine has.
  m.def(
      "_io_policy",
      [](const std::string& io, int64_t record_bytes, int64_t total_bytes, int64_t mem_available) {
        return std::string(choice_name(choose_mode(parse_choice<IoMode>("io", io), record_bytes, total_bytes, mem_available)));
      },
      py::arg("io"), py::arg("record_bytes"), py::arg("total_bytes"), py::arg("mem_available"));
  m.def("_default_num_threads", &default_num_threads, py::arg("cores"), py::arg("any_direct"),
        py::arg("decodes") = false);
  m.def("_default_prefetch", &default_prefetch, py::arg("batch_bytes"));
  m.def("_chunk_records", &chunk_records, py::arg("batch_size"), py::arg("prefetch"), py::arg("num_threads"),
        py::arg("record_bytes"), py::arg("decodes") = false);
}

}  // namespace fastpipe
