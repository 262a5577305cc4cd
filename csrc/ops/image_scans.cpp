// Python bindings of the scans that build image sources: the threaded header scan and stat of an image
// folder's files (core/image_scan.h), and the index of WebDataset shards (core/tar_index.h). Each runs
// without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "core/image_scan.h"
#include "core/record_source.h"
#include "core/tar_index.h"
#include "ops/bindings.h"
#include "ops/numpy_arrays.h"

namespace py = pybind11;

namespace fastpipe {

void bind_image_scans(py::module& m) {
  m.def(
      "scan_image_files",
      [](const std::string& root, py::bytes names, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
         int threads) {
        const std::string n = names;
        const std::vector<int64_t> off = to_vector(offsets, "offsets");
        ImageScan s;
        {
          py::gil_scoped_release nogil;
          s = scan_image_files(root, n, off, threads);
        }
        py::dict d;
        d["heights"] = as_array(s.heights);
        d["widths"] = as_array(s.widths);
        d["bytes"] = as_array(s.bytes);
        d["formats"] = as_array(s.formats);
        d["mtimes"] = as_array(s.mtimes);
        d["bad"] = as_array(s.bad);
        d["reasons"] = s.reasons;
        return d;
      },
      py::arg("root"), py::arg("names"), py::arg("offsets"), py::arg("threads"),
      "Headers of files root/names[i]: heights, widths, formats, bytes, mtimes per file; bad records and why.");
  m.def(
      "index_webdataset",
      [](const std::vector<std::string>& shards, const std::vector<std::string>& image_extensions,
         const std::string& label_extension, const std::string& label_field, int threads) {
        WebDatasetIndex x;
        {
          py::gil_scoped_release nogil;
          x = index_webdataset(shards, image_extensions, label_extension, label_field, threads);
        }
        py::dict d;
        d["shard_of"] = as_array(x.shard_of);
        d["offsets"] = as_array(x.offsets);
        d["sizes"] = as_array(x.sizes);
        d["labels"] = as_array(x.labels);
        d["keys"] = py::bytes(x.keys);
        d["key_offsets"] = as_array(x.key_offsets);
        d["heights"] = as_array(x.heights);
        d["widths"] = as_array(x.widths);
        d["formats"] = as_array(x.formats);
        d["bad"] = as_array(x.bad);
        d["reasons"] = x.reasons;
        d["without_image"] = as_array(x.without_image);
        return d;
      },
      py::arg("shards"), py::arg("image_extensions"), py::arg("label_extension"), py::arg("label_field"),
      py::arg("threads"),
      "WebDataset shards' samples (core/tar_index.h): per sample its shard, image member offset and size, label, "
      "key, image header size and format; bad samples and why; per shard the samples without an image.");
  m.def(
      "read_tar_members",
      [](const std::string& path) {
        std::vector<TarMember> members;
        {
          py::gil_scoped_release nogil;
          members = read_tar_members(*open_record_source(path, IoMode::kPread));
        }
        py::list out;
        for (const TarMember& m : members) out.append(py::make_tuple(py::bytes(m.name), m.offset, m.size));
        return out;
      },
      py::arg("path"), "The regular files of a tar archive: (name as bytes, data offset, size), in archive order.");
  m.def(
      "stat_image_files",
      [](const std::string& root, py::bytes names, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
         int threads) {
        const std::string n = names;
        const std::vector<int64_t> off = to_vector(offsets, "offsets");
        std::vector<int64_t> bytes, mtimes;
        {
          py::gil_scoped_release nogil;
          stat_image_files(root, n, off, threads, &bytes, &mtimes);
        }
        return py::make_tuple(as_array(bytes), as_array(mtimes));
      },
      py::arg("root"), py::arg("names"), py::arg("offsets"), py::arg("threads"),
      "(bytes, mtimes in ns) of files root/names[i]; -1 where one cannot be stat'ed.");
}

}  // namespace fastpipe
