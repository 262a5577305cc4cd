// Python bindings of what the datasets and transforms hand the batch reader: column specs, the
// transforms' parameters, image sources (packed files, folders and WebDataset shards), the image header
// reader and the decoders this build has. The scans that build image sources: image_scans.cpp.
#include <c10/util/Exception.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>

#include <string_view>

#include "core/choices.h"
#include "core/error.h"
#include "core/gather.h"
#include "core/image_column.h"
#include "core/image_scan.h"
#include "core/jpeg_decode.h"
#include "ops/augment_specs.h"
#include "ops/bindings.h"
#include "ops/numpy_arrays.h"
#include "ops/pillow_decoder.h"
#include "ops/reader_config.h"
#ifdef FASTPIPE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda_host/nvjpeg.h"
#endif

namespace py = pybind11;

namespace fastpipe {

// The resize's filter and whose arithmetic it reproduces (kernels/resample_taps.h), by the names
// fastpipe.transforms takes (_C.IMAGE_CHOICES).
template <>
struct Choices<images::Filter> {
  static constexpr Named<images::Filter> names[] = {
      {images::Filter::kBilinear, "bilinear"}, {images::Filter::kBicubic, "bicubic"}, {images::Filter::kNearest, "nearest"}};
};
template <>
struct Choices<images::ResizeAs> {
  static constexpr Named<images::ResizeAs> names[] = {{images::ResizeAs::kPil, "pil"},
                                                      {images::ResizeAs::kTorchUint8, "torch_uint8"},
                                                      {images::ResizeAs::kTorchFloat, "torch_float"}};
};

namespace {

using transforms::CropMirrorNormalizeParams;

// An output dtype's name; uint8 only where the transform produces it (the JPEG transforms).
transforms::OutDtype parse_out_dtype(const std::string& name, bool allow_uint8) {
  static const std::pair<const char*, transforms::OutDtype> kOut[] = {{"float32", transforms::OutDtype::Float32},
                                                                      {"float16", transforms::OutDtype::Float16},
                                                                      {"bfloat16", transforms::OutDtype::BFloat16},
                                                                      {"uint8", transforms::OutDtype::UInt8}};
  for (const auto& [n, d] : kOut)
    if (name == n && (allow_uint8 || d != transforms::OutDtype::UInt8)) return d;
  TORCH_CHECK(false, "out_dtype must be float32, float16, bfloat16", allow_uint8 ? " or uint8" : "", ", got ", name);
}


py::dict header_dict(const ImageHeader& h) {
  py::dict d;
  d["format"] = image_format_name(h.format);
  d["height"] = h.height;
  d["width"] = h.width;
  if (h.format == ImageFormat::kOther) d["sniffed"] = h.other;
  if (h.format == ImageFormat::kPng) {
    d["bit_depth"] = h.png.bit_depth;
    d["color_type"] = h.png.color_type;
    d["interlaced"] = h.png.interlaced;
  }
  if (h.format == ImageFormat::kWebp) d["animated"] = h.webp.animated;
  if (h.format != ImageFormat::kJpeg) return d;
  const JpegInfo& info = h.jpeg;
  d["components"] = info.components;
  d["precision"] = info.precision;
  d["process"] = jpeg_process_name(info.sof);
  d["adobe_transform"] = info.adobe_transform;
  d["orientation"] = info.orientation;
  py::list sampling;
  for (int c = 0; c < info.components && c < 4; ++c) sampling.append(py::make_tuple(info.h_samp[c], info.v_samp[c]));
  d["sampling"] = sampling;
  return d;
}

py::tuple geometry_tuple(const images::Geometry& g) {
  return py::make_tuple(g.top, g.left, g.height, g.width, g.flip, g.denom);
}

// RandomErasing's (p, scale, ratio, value) as fastpipe.transforms.RandomErasing holds them (its defaults
// are torchvision's, kept there only).
using Erasing = std::tuple<float, std::pair<double, double>, std::pair<double, double>, std::vector<float>>;

}  // namespace

void bind_loader_specs(py::module& m) {
  bind_augment_tables(m);
  py::dict image_choices;
  image_choices["interpolation"] = choice_names<images::Filter>();
  image_choices["resize_as"] = choice_names<images::ResizeAs>();
  m.attr("IMAGE_CHOICES") = image_choices;
  // CropMirrorNormalize's parameters (kernels/transforms.h), filled by fastpipe/transforms.py.
  using transforms::CropMirrorNormalizeParams;
  py::class_<CropMirrorNormalizeParams, std::shared_ptr<CropMirrorNormalizeParams>>(m, "CropMirrorNormalizeParams")
      .def(py::init([](int in_height, int in_width, int channels, bool in_hwc, int out_height, int out_width,
                       bool out_nhwc, const std::string& out_dtype, bool random_crop, float mirror,
                       const std::vector<float>& scale, const std::vector<float>& shift, uint64_t seed, int pad) {
             auto p = std::make_shared<CropMirrorNormalizeParams>();
             TORCH_CHECK(channels >= 1 && channels <= transforms::kMaxChannels, "channels must be 1 to ",
                         transforms::kMaxChannels, ", got ", channels);
             TORCH_CHECK(pad >= 0, "pad must be at least 0, got ", pad);
             TORCH_CHECK(out_height >= 1 && out_height <= in_height + 2 * pad && out_width >= 1 &&
                             out_width <= in_width + 2 * pad,
                         "the crop ", out_height, "x", out_width, " must fit in the image ", in_height, "x", in_width,
                         " padded by ", pad);
             TORCH_CHECK(scale.size() == static_cast<size_t>(channels) && shift.size() == scale.size(),
                         "scale and shift need one value per channel");
             const transforms::OutDtype dtype = parse_out_dtype(out_dtype, false);
             *p = CropMirrorNormalizeParams{in_height, in_width, channels, in_hwc, out_height, out_width, out_nhwc,
                                            dtype, random_crop, mirror, {}, {}, seed, pad};
             std::copy(scale.begin(), scale.end(), p->scale);
             std::copy(shift.begin(), shift.end(), p->shift);
             return p;
           }),
           py::kw_only(), py::arg("in_height"), py::arg("in_width"), py::arg("channels"), py::arg("in_hwc"),
           py::arg("out_height"), py::arg("out_width"), py::arg("out_nhwc"), py::arg("out_dtype"),
           py::arg("random_crop"), py::arg("mirror"), py::arg("scale"), py::arg("shift"), py::arg("seed"),
           py::arg("pad") = 0)
      .def(
          "windows",
          [](const CropMirrorNormalizeParams& p, const std::vector<int64_t>& index, uint64_t epoch) {
            std::vector<std::tuple<int, int, bool>> out;
            for (int64_t i : index) {
              const auto w = transforms::sample_window(p, epoch, static_cast<uint64_t>(i));
              out.emplace_back(w.y0, w.x0, w.flip);
            }
            return out;
          },
          py::arg("index"), py::arg("epoch"),
          "(y0, x0, flip) of each sample of `epoch`: where its crop starts in the image (negative in the padding) "
          "and whether it is flipped.");

  // A column of records in a file (core/gather.h), built by the datasets with keyword arguments.
  py::class_<ColumnSpec>(m, "ColumnSpec")
      .def(py::init([](std::string path, int64_t data_offset, int64_t record_stride, int64_t record_bytes,
                       int64_t num_records, int token_bytes, bool token_signed,
                       std::shared_ptr<const CropMirrorNormalizeParams> transform,
                       std::shared_ptr<const ImageColumnSpec> image) {
             return ColumnSpec{std::move(path), data_offset,  record_stride,        record_bytes, num_records,
                               token_bytes,     token_signed, std::move(transform), std::move(image)};
           }),
           py::kw_only(), py::arg("path"), py::arg("data_offset"), py::arg("record_stride"), py::arg("record_bytes"),
           py::arg("num_records"), py::arg("token_bytes") = 0, py::arg("token_signed") = false,
           py::arg("transform") = nullptr, py::arg("image") = nullptr)
      .def_readonly("path", &ColumnSpec::path)
      .def_readonly("data_offset", &ColumnSpec::data_offset)
      .def_readonly("record_stride", &ColumnSpec::record_stride)
      .def_readonly("record_bytes", &ColumnSpec::record_bytes)
      .def_readonly("num_records", &ColumnSpec::num_records);


  // The JPEG transforms' parameters (kernels/image_transform.h), filled by fastpipe/transforms.py.
  using images::ImageTransformParams;
  py::class_<ImageTransformParams>(m, "ImageTransformParams")
      .def(py::init([](const std::string& mode, int out_height, int out_width, std::pair<double, double> area,
                       std::pair<double, double> ratio, int resize_short, int resize_height, int resize_width,
                       float mirror, bool out_nhwc, const std::string& out_dtype, const std::vector<float>& scale,
                       const std::vector<float>& shift, uint64_t seed, int max_dct_denom,
                       const std::optional<Erasing>& erase, const std::vector<py::dict>& augment_stages,
                       const std::vector<std::tuple<int, bool, float, int, int>>& augment_candidates,
                       const std::vector<float>& augment_magnitudes, const std::vector<int>& augment_fill,
                       const std::string& augment_interpolation, int augment_blend, const std::vector<float>& augment_fill_value,
                       std::tuple<bool, bool, bool> augment_rounding, const std::string& interpolation,
                       const std::string& resize_as, bool pil_vertical_first, std::tuple<int, int, int, int> pad,
                       bool pad_if_needed) {
             ImageTransformParams p;
             p.filter = parse_choice<images::Filter>("interpolation", interpolation);
             p.resize_as = parse_choice<images::ResizeAs>("resize_as", resize_as);
             p.pil_vertical_first = pil_vertical_first;
             TORCH_CHECK(mode == "random_resized" || mode == "center" || mode == "random",
                         "mode must be random_resized, center or random");
             p.mode = mode == "center"   ? images::CropMode::kCenter
                      : mode == "random" ? images::CropMode::kRandom
                                         : images::CropMode::kRandomResized;
             TORCH_CHECK(out_height >= 1 && out_width >= 1, "the output size must be positive");
             TORCH_CHECK(area.first > 0 && area.first <= area.second, "area must be 0 < lo <= hi");
             TORCH_CHECK(ratio.first > 0 && ratio.first <= ratio.second, "ratio must be 0 < lo <= hi");
             TORCH_CHECK(scale.size() == images::kChannels && shift.size() == images::kChannels,
                         "scale and shift need 3 values");
             TORCH_CHECK(max_dct_denom == 1 || max_dct_denom == 2 || max_dct_denom == 4 || max_dct_denom == 8,
                         "max_dct_denom must be 1, 2, 4 or 8");
             p.out_height = out_height;
             p.out_width = out_width;
             p.area_min = area.first;
             p.area_max = area.second;
             p.ratio_min = ratio.first;
             p.ratio_max = ratio.second;
             p.resize_short = resize_short;
             p.resize_height = resize_height;
             p.resize_width = resize_width;
             const auto [pad_top, pad_left, pad_bottom, pad_right] = pad;
             TORCH_CHECK(pad_top >= 0 && pad_left >= 0 && pad_bottom >= 0 && pad_right >= 0,
                         "padding must not be negative");
             TORCH_CHECK(p.mode == images::CropMode::kRandom || (pad == std::make_tuple(0, 0, 0, 0) && !pad_if_needed),
                         "padding and pad_if_needed are RandomCrop's");
             p.pad_top = pad_top;
             p.pad_left = pad_left;
             p.pad_bottom = pad_bottom;
             p.pad_right = pad_right;
             p.pad_if_needed = pad_if_needed;
             p.mirror = mirror;
             p.out_nhwc = out_nhwc;
             p.out_dtype = parse_out_dtype(out_dtype, true);
             std::copy(scale.begin(), scale.end(), p.scale);
             std::copy(shift.begin(), shift.end(), p.shift);
             p.seed = seed;
             p.max_dct_denom = max_dct_denom;
             if (erase) {  // else p.erase.p stays 0: nothing erased
               const auto& [erase_p, erase_scale, erase_ratio, erase_value] = *erase;
               TORCH_CHECK(erase_p >= 0 && erase_p <= 1, "erase p must be in [0, 1]");
               TORCH_CHECK(erase_scale.first > 0 && erase_scale.first <= erase_scale.second && erase_scale.second <= 1,
                           "erase scale must be 0 < lo <= hi <= 1");
               TORCH_CHECK(erase_ratio.first > 0 && erase_ratio.first <= erase_ratio.second,
                           "erase ratio must be 0 < lo <= hi");
               TORCH_CHECK(erase_value.size() == images::kChannels, "erase value needs 3 values");
               p.erase.p = erase_p;
               p.erase.scale_min = erase_scale.first;
               p.erase.scale_max = erase_scale.second;
               p.erase.ratio_min = erase_ratio.first;
               p.erase.ratio_max = erase_ratio.second;
               std::copy(erase_value.begin(), erase_value.end(), p.erase.value);
             }
             set_augment(p.augment, augment_stages, augment_candidates, augment_magnitudes, augment_fill,
                         augment_interpolation, augment_blend, augment_fill_value, augment_rounding);
             // The limits the draws and the ops rely on, checked here where the spec becomes the engine's
             // (fastpipe/augment.py checks them first, for its messages).
             TORCH_CHECK(images::most_ops(p.augment) <= images::kMaxAugmentOps, "the augment stages draw up to ",
                         images::most_ops(p.augment), " ops a sample; at most ", images::kMaxAugmentOps);
             for (int n = 0; n < p.augment.stages; ++n) {
               const images::AugmentStage& st = p.augment.stage[n];
               TORCH_CHECK(st.kind != static_cast<int>(images::AugmentStageKind::kBlur) ||
                               (st.taps[0] / 2 < out_width && st.taps[1] / 2 < out_height),
                           "a blur's kernel (", st.taps[0], " x ", st.taps[1], ") must fit the ", out_width, " x ",
                           out_height, " output: its radius below each side");
             }
             return p;
           }),
           py::kw_only(), py::arg("mode"), py::arg("out_height"), py::arg("out_width"), py::arg("area"),
           py::arg("ratio"), py::arg("resize_short"), py::arg("resize_height"), py::arg("resize_width"),
           py::arg("mirror"), py::arg("out_nhwc"), py::arg("out_dtype"), py::arg("scale"), py::arg("shift"),
           py::arg("seed"), py::arg("max_dct_denom"), py::arg("erase") = py::none(),
           py::arg("augment_stages") = std::vector<py::dict>{},
           py::arg("augment_candidates") = std::vector<std::tuple<int, bool, float, int, int>>{},
           py::arg("augment_magnitudes") = std::vector<float>{}, py::arg("augment_fill") = std::vector<int>{0, 0, 0},
           py::arg("augment_interpolation") = "nearest", py::arg("augment_blend") = 0,
           py::arg("augment_fill_value") = std::vector<float>{0.0f, 0.0f, 0.0f},
           py::arg("augment_rounding") = std::make_tuple(true, true, true), py::arg("interpolation") = "bilinear",
           py::arg("resize_as") = "pil", py::arg("pil_vertical_first") = true,
           py::arg("pad") = std::make_tuple(0, 0, 0, 0), py::arg("pad_if_needed") = false)
      .def(
          "geometry",
          [](const ImageTransformParams& p, int height, int width, uint64_t epoch, uint64_t index) {
            TORCH_CHECK(height >= 1 && width >= 1, "the image size must be positive, got ", width, "x", height);
            return geometry_tuple(images::image_geometry(p, height, width, epoch, index));
          },
          py::arg("height"), py::arg("width"), py::arg("epoch"), py::arg("index"),
          "(top, left, height, width, flip, dct_denom) of sample `index` of `epoch` for an image of that size.")
      .def(
          "erase_box",
          [](const ImageTransformParams& p, uint64_t epoch, uint64_t index) {
            const images::EraseBox b = images::erase_box(p.erase, p.seed, epoch, index, p.out_height, p.out_width);
            return py::make_tuple(b.top, b.left, b.height, b.width);
          },
          py::arg("epoch"), py::arg("index"),
          "RandomErasing's (top, left, height, width) in sample `index`'s output in `epoch` (height 0: none).")
      .def(
          "augment_ops",
          [](const ImageTransformParams& p, uint64_t epoch, uint64_t index) {
            const images::SampleOps ops =
                images::draw_augment(p.augment, p.seed, epoch, index, p.out_height, p.out_width);
            py::list out;
            for (int k = 0; k < ops.count; ++k)
              out.append(py::make_tuple(ops.op[k].op, ops.op[k].magnitude, ops.op[k].by_factor != 0));
            return out;
          },
          py::arg("epoch"), py::arg("index"),
          "The augmentations of sample `index` in `epoch`: [(op, magnitude, by_factor)] in order (op: augment_ops.h's "
          "AugOp; by_factor: a ColorJitter adjustment or RandomGrayscale, whose magnitude is the factor).");

  // Where an image column's encoded records are (core/image_column.h).
  py::class_<ImageSource, std::shared_ptr<ImageSource>>(m, "ImageSource")
      .def_static(
          "packed",
          [](std::string path, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
             const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& heights,
             const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& widths) {
            auto s = std::make_shared<ImageSource>();
            s->packed_path = std::move(path);
            s->offsets = to_vector(offsets, "offsets");
            s->heights = to_vector(heights, "heights");
            s->widths = to_vector(widths, "widths");
            s->check();
            return s;
          },
          py::arg("path"), py::arg("offsets"), py::arg("heights"), py::arg("widths"))
      .def_static(
          "folder",
          [](std::string root, py::bytes names, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
             const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& heights,
             const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& widths) {
            auto s = std::make_shared<ImageSource>();
            s->root = std::move(root);
            s->names = names;
            s->name_offsets = to_vector(offsets, "name_offsets");
            s->heights = to_vector(heights, "heights");
            s->widths = to_vector(widths, "widths");
            s->check();
            return s;
          },
          py::arg("root"), py::arg("names"), py::arg("name_offsets"), py::arg("heights"), py::arg("widths"))
      .def_static(
          "members",
          [](std::vector<std::string> shards, const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& shard_of,
             const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
             const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& sizes, py::bytes keys,
             const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& key_offsets,
             const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& heights,
             const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& widths,
             std::shared_ptr<ShardOpener> stream) {
            auto s = std::make_shared<ImageSource>();
            s->shards = std::move(shards);
            s->stream = std::move(stream);
            s->shard_of = to_vector(shard_of, "shard_of");
            s->member_offsets = to_vector(offsets, "offsets");
            s->member_sizes = to_vector(sizes, "sizes");
            s->names = keys;
            s->name_offsets = to_vector(key_offsets, "key_offsets");
            s->heights = to_vector(heights, "heights");
            s->widths = to_vector(widths, "widths");
            s->check();
            return s;
          },
          py::arg("shards"), py::arg("shard_of"), py::arg("offsets"), py::arg("sizes"), py::arg("keys"),
          py::arg("key_offsets"), py::arg("heights"), py::arg("widths"), py::arg("stream") = py::none())
      .def_property_readonly("num_records", &ImageSource::num_records)
      .def("describe", &ImageSource::describe, py::arg("index"));

  py::class_<ImageColumnSpec, std::shared_ptr<ImageColumnSpec>>(m, "ImageColumnSpec")
      .def(py::init([](std::shared_ptr<const ImageSource> source, const ImageTransformParams& transform,
                       int64_t max_record_bytes, bool device_decode, int64_t encoded_budget, int64_t pixel_budget,
                       py::object fallback) {
             TORCH_CHECK(!device_decode || (encoded_budget > 0 && pixel_budget > 0),
                         "a column decoded on the device needs positive encoded and pixel budgets");
             auto s = std::make_shared<ImageColumnSpec>();
             s->source = std::move(source);
             s->transform = transform;
             s->max_record_bytes = max_record_bytes;
             s->device_decode = device_decode;
             s->encoded_budget = encoded_budget;
             s->pixel_budget = pixel_budget;
             if (!fallback.is_none()) s->fallback = python_fallback_decoder(std::move(fallback));
             return s;
           }),
           py::arg("source"), py::arg("transform"), py::arg("max_record_bytes"), py::arg("device_decode") = false,
           py::arg("encoded_budget") = 0, py::arg("pixel_budget") = 0, py::arg("fallback") = py::none())
      .def_property_readonly("fallback_decoded",
                             [](const ImageColumnSpec& s) { return s.fallback ? s.fallback->decoded() : 0; });

  m.def(
      "image_info",
      [](py::bytes data) {
        const std::string_view v = data;
        ImageHeader header;
        const std::string why = check_image(reinterpret_cast<const uint8_t*>(v.data()), v.size(), &header);
        if (!why.empty()) throw Error(ErrorKind::kValue, why);
        return header_dict(header);
      },
      py::arg("data"),
      "The header of an encoded image: its format (JPEG, PNG, WebP; 'other' or 'unknown' for the fallback decoder, "
      "size 0 x 0) and size (ValueError: why a JPEG, PNG or WebP cannot be decoded).");
  // What this build decodes in the reader threads; other images go to the fallback decoder (Pillow).
  auto decoder = [](bool built, const std::string& library) {
    py::dict d;
    d["decode"] = built;
    d["library"] = library;
    return d;
  };
  m.attr("JPEG") = decoder(jpeg_decoding_built(), jpeg_library_version());
  m.attr("PNG") = decoder(png_decoding_built(), png_library_version());
  m.attr("WEBP") = decoder(webp_decoding_built(), webp_library_version());
  py::list formats;  // ImageFormat's values index this list (image folders' indexes store them)
  for (int f = 0; f <= static_cast<int>(ImageFormat::kOther); ++f) formats.append(image_format_name(static_cast<ImageFormat>(f)));
  m.attr("IMAGE_FORMATS") = py::tuple(formats);
  m.def(
      "nvjpeg_status",
      [](int device, const std::string& path) -> py::tuple {
#ifdef FASTPIPE_WITH_CUDA
        // Loads and initialises nvJPEG on `device` (then releases it): "" and the backend, or why not.
        int previous = 0;
        if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
          cudaGetLastError();
          return py::make_tuple(false, "cannot select cuda:" + std::to_string(device));
        }
        std::string why;
        auto decoder = cuda::make_jpeg_decoder(path, &why);
        const bool ok = decoder != nullptr;
        const std::string backend = ok ? decoder->backend() : "";
        decoder.reset();
        cudaSetDevice(previous);  // the caller's current device is left as it was
        return py::make_tuple(ok, ok ? backend : why);
#else
        (void)device;
        (void)path;
        return py::make_tuple(false, std::string("fastpipe was built without CUDA"));
#endif
      },
      py::arg("device"), py::arg("path") = "",
      "(True, backend) when nvJPEG loads and initialises on `device`, else (False, why).");
}

}  // namespace fastpipe
