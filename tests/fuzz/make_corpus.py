"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/): valid and defective .npy files for
npy_header_fuzz, token-file inputs (control bytes + file) for token_file_fuzz, and JPEG, PNG and WebP
inputs (control bytes + file, written with Pillow and tests/data/image_files.py) for image_fuzz, and
WebDataset shards (tar archives) for tar_fuzz.

The files are committed, so run.sh needs neither numpy nor Pillow; rerun this after changing it
(python3 tests/fuzz/make_corpus.py). Reproducers of fixed bugs are added by hand (named fixed-*) and
are left alone here.
"""

import io
import os
import struct
import tarfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
NPY = os.path.join(HERE, "corpus", "npy")
TOKENS = os.path.join(HERE, "corpus", "tokens")
IMAGE = os.path.join(HERE, "corpus", "image")
TAR = os.path.join(HERE, "corpus", "tar")

# token_file_fuzz's control bytes: flags, dtype index / token_bytes, block_size (see its header).
NPY_FILE, PREAD, DIRECT, SPEC, SIGNED = 1, 2, 4, 8, 16
TOKEN_TYPES = ["uint8", "uint16", "int16", "int32", "uint32", "int64"]


def npy_bytes(arr, version=None):
    f = io.BytesIO()
    np.lib.format.write_array(f, arr, version=version, allow_pickle=False)
    return f.getvalue()


def npy_raw_header(header, version=1, data=b""):
    """A .npy file with a header dict written by hand (numpy would refuse to write these)."""
    h = header.encode("latin1")
    length = struct.pack("<H" if version == 1 else "<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + length + h + data


def npy_corpus():
    a23 = np.arange(6, dtype=np.float32).reshape(2, 3)
    valid = {
        "v1_float32_2x3": npy_bytes(a23),
        "v1_int64_5": npy_bytes(np.arange(5, dtype=np.int64) - 2),
        "v1_uint8_4x0": npy_bytes(np.zeros((4, 0), np.uint8)),
        "v1_bool_0": npy_bytes(np.zeros((0,), np.bool_)),
        "v1_float16_3x2x2": npy_bytes(np.ones((3, 2, 2), np.float16)),
        "v1_int8_1x1x1x1": npy_bytes(np.full((1, 1, 1, 1), -3, np.int8)),
        "v1_float64_0x5": npy_bytes(np.zeros((0, 5), np.float64)),
        "v2_uint16_7": npy_bytes(np.arange(7, dtype=np.uint16), version=(2, 0)),
        "v3_int16_3": npy_bytes(np.array([-1, 0, 1], np.int16), version=(3, 0)),
        "v2_int32_2x2": npy_bytes(np.arange(4, dtype=np.int32).reshape(2, 2), version=(2, 0)),
        # Python 2 era spellings numpy still reads: double quotes, long literals, no trailing comma.
        "v1_py2_long": npy_raw_header('{"descr": "<i4", "fortran_order": False, "shape": (2L,)}\n', data=bytes(8)),
        # A header past read_npy_header's first 4 KiB read.
        "v2_long_header": npy_raw_header("{'descr': '<u1', 'fortran_order': False, 'shape': (3,), }" + " " * 4500
                                         + "\n", version=2, data=b"abc"),
    }
    good = npy_bytes(a23)
    defective = {
        "bad_0d_float64": npy_bytes(np.array(2.5)),
        "bad_bigendian_f4": npy_bytes(np.arange(3, dtype=">f4")),
        "bad_fortran_2x3": npy_bytes(np.asfortranarray(a23)),
        "bad_structured": npy_bytes(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])),
        "bad_unicode": npy_bytes(np.array(["ab", "c"])),
        "bad_complex64": npy_bytes(np.zeros(2, np.complex64)),
        "bad_truncated": good[:-5],
        "bad_header_only": good[:20],
        "bad_magic": b"\x93NUMPX" + good[6:],
        "bad_version_4": good[:6] + b"\x04\x00" + good[8:],
        "bad_header_len": good[:8] + b"\xff\xff" + good[10:],
        "bad_v2_header_len": npy_raw_header("{}", version=2)[:8] + b"\xff\xff\xff\x7f{}",
        "bad_duplicate_key": npy_raw_header("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
                                            data=bytes(4)),
        "bad_dim_overflow": npy_raw_header("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4)}"),
        "bad_trailing": npy_raw_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x", data=bytes(4)),
    }
    return {f"{k}.npy": v for k, v in {**valid, **defective}.items()}


def token_input(flags, type_byte, block, content, spec=None):
    head = bytes([flags, type_byte]) + struct.pack("<H", block)
    return head + (struct.pack("<4q", *spec) if spec else b"") + content


def tokens_corpus():
    rng = np.random.default_rng(0)

    def raw(dtype, n):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True).tobytes()

    t = TOKEN_TYPES.index
    return {
        "raw_uint16_mmap_block4.bin": token_input(0, t("uint16"), 4, raw(np.uint16, 21)),
        "raw_uint8_pread_block1.bin": token_input(PREAD, t("uint8"), 1, raw(np.uint8, 9)),
        "raw_int16_direct_block3.bin": token_input(DIRECT, t("int16"), 3, raw(np.int16, 13)),
        "raw_int32_mmap_block2.bin": token_input(0, t("int32"), 2, raw(np.int32, 7)),
        "raw_uint32_pread_block5.bin": token_input(PREAD, t("uint32"), 5, raw(np.uint32, 16)),
        "raw_int64_mmap_block2.bin": token_input(0, t("int64"), 2, raw(np.int64, 5)),
        "raw_too_short.bin": token_input(0, t("uint16"), 8, raw(np.uint16, 8)),
        "raw_partial_token.bin": token_input(0, t("int32"), 1, raw(np.int32, 4)[:-1]),
        "npy_uint16_mmap_block5.bin": token_input(NPY_FILE, 0, 5, npy_bytes(np.frombuffer(raw(np.uint16, 26), np.uint16))),
        "npy_int64_v2_pread_block3.bin": token_input(NPY_FILE | PREAD, 0, 3,
                                                     npy_bytes(np.arange(-5, 5, dtype=np.int64), version=(2, 0))),
        "npy_int8_direct_block2.bin": token_input(NPY_FILE | DIRECT, 0, 2, npy_bytes(np.arange(-4, 4, dtype=np.int8))),
        "npy_float32_rejected.bin": token_input(NPY_FILE, 0, 2, npy_bytes(np.zeros(8, np.float32))),
        "npy_2d_rejected.bin": token_input(NPY_FILE, 0, 2, npy_bytes(np.zeros((4, 2), np.int32))),
        # Spec mode: (data_offset, record_stride, record_bytes, num_records) straight from the input.
        "spec_int32_windows.bin": token_input(SPEC | SIGNED, 4, 0, raw(np.int32, 8), spec=(4, 8, 12, 3)),
        "spec_copy_records.bin": token_input(SPEC | PREAD, 0, 0, raw(np.uint8, 32), spec=(2, 6, 5, 5)),
        "spec_past_end.bin": token_input(SPEC, 2, 0, raw(np.uint16, 6), spec=(0, 4, 6, 4)),
    }


def image_corpus():
    import sys

    from PIL import Image

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))
    from image_files import animated_webp, random_png

    rng = np.random.default_rng(7)
    pic = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    im = Image.fromarray(pic).resize((37, 29), Image.BICUBIC)

    def enc(image, **kw):
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=kw.pop("quality", 85), **kw)
        return out.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6
    base = enc(im)
    sof = base.index(b"\xff\xc0")
    def webp(image, **kw):
        out = io.BytesIO()
        image.save(out, format="WEBP", **kw)
        return out.getvalue()

    # Control bytes (image_fuzz.cpp): transform flags, output height, output width, area/ratio/DCT bits.
    files = {
        "baseline_center.bin": b"\x00\x10\x18\x00" + base,
        "baseline_rrc_flip.bin": b"\x09\x20\x20\x5c" + base,
        "progressive_resize.bin": b"\x02\x08\x09\x0c" + enc(im, progressive=True),
        "grayscale_nhwc.bin": b"\x10\x0f\x0f\x00" + enc(im.convert("L")),
        "cmyk_uint8.bin": b"\x61\x11\x07\x00" + enc(im.convert("CMYK")),
        "444_bf16.bin": b"\x45\x30\x21\x0c" + enc(im, subsampling=0),
        "422_fixed_resize.bin": b"\x04\x05\x40\x08" + enc(im, subsampling=1),
        "restart_markers.bin": b"\x01\x10\x10\x00" + enc(im, restart_marker_blocks=2),
        "exif_orientation.bin": b"\x00\x08\x08\x00" + enc(im, exif=exif.tobytes()),
        "one_pixel.bin": b"\x01\x3f\x3f\x0c" + enc(im.resize((1, 1))),
        "large_dct.bin": b"\x00\x03\x04\x0c" + enc(im.resize((400, 300), Image.BICUBIC)),
        "truncated.bin": b"\x00\x10\x10\x00" + base[: len(base) * 2 // 3],
        "header_only.bin": b"\x00\x10\x10\x00" + base[: sof + 19],
        "lossless_sof3.bin": b"\x00\x10\x10\x00" + base[: sof + 1] + b"\xc3" + base[sof + 2:],
        "png_header_zeros.bin": b"\x00\x10\x10\x00" + b"\x89PNG\r\n\x1a\n" + bytes(24),
        "webp_lossy_rrc.bin": b"\x09\x20\x18\x5c" + webp(im, quality=70),
        "webp_lossless_center.bin": b"\x10\x0f\x11\x00" + webp(im, lossless=True),
        "webp_alpha.bin": b"\x01\x10\x10\x00" + webp(im.convert("RGBA"), quality=60),
        "webp_animated.bin": b"\x00\x10\x10\x00" + animated_webp([pic, 255 - pic]),
        "webp_truncated.bin": b"\x00\x10\x10\x00" + webp(im, quality=70)[:-30],
        "gif.bin": b"\x00\x10\x10\x00" + b"GIF89a" + bytes(20),
        # The top bit: every augmentation op, a colour jitter, grayscale and a blur (image_fuzz.cpp).
        "augmented_rrc.bin": b"\x89\x20\x18\x5c" + base,
        "augmented_uint8_nhwc.bin": b"\xf0\x0c\x21\x00" + base,
        "augmented_one_pixel_out.bin": b"\x80\x00\x00\x00" + base,
        "augmented_one_pixel_in.bin": b"\x81\x3f\x3f\x0c" + enc(im.resize((1, 1))),
    }
    for color_type, depth in ((0, 1), (0, 16), (2, 8), (3, 2), (4, 16), (6, 8)):
        for interlace in (False, True):
            data = random_png(rng, color_type, depth, 13, 21, interlace=interlace)
            files[f"png_{color_type}_{depth}{'_adam7' if interlace else ''}.bin"] = b"\x41\x09\x0b\x00" + data
    files["png_truncated.bin"] = b"\x00\x10\x10\x00" + random_png(rng, 2, 8, 13, 21)[:-40]
    return files


def tar_corpus():
    """WebDataset shards (tar_fuzz.cpp): the three tar formats, long names, directories, metadata members,
    and the defects construction must refuse."""
    import sys

    from PIL import Image

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))
    from tar_files import tar_bytes

    rng = np.random.default_rng(11)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)).save(out, format="JPEG", quality=80)
    jpg = out.getvalue()
    good = [("a/s0.jpg", jpg), ("a/s0.cls", b"3"), ("a/s1.JPG", jpg), ("a/s1.cls", b" 12\n"), ("a/s1.json", b"{}")]
    long_name = "d" * 120 + "/sample.with.dots.jpg"
    files = {
        "ustar.tar": tar_bytes(good),
        "gnu_long_names.tar": tar_bytes([("dir", None), (long_name, jpg), (long_name[:-3] + "cls", b"1")],
                                        tarfile.GNU_FORMAT),
        "pax.tar": tar_bytes([("__meta__", b"x"), ("p/" + "q" * 150 + ".png", jpg), ("p/" + "q" * 150 + ".cls", b"0")],
                             tarfile.PAX_FORMAT),
        "no_image.tar": tar_bytes([("x.txt", b"hi"), ("x.cls", b"1"), ("y.jpg", jpg), ("y.cls", b"2")]),
        "duplicate_suffix.tar": tar_bytes([("k.jpg", jpg), ("k.jpg", jpg), ("k.cls", b"1")]),
        "missing_label.tar": tar_bytes([("k.jpg", jpg)]),
        "bad_label.tar": tar_bytes([("k.jpg", jpg), ("k.cls", b"-1")]),
        "bad_image.tar": tar_bytes([("k.jpg", jpg[: len(jpg) // 2]), ("k.cls", b"1")]),
    }
    files["json_labels.tar"] = tar_bytes([("a.jpg", jpg), ("a.json", b'{"x": [1, {"y": "\\u00e9\\ud83d\\ude00"}], "label": 4}'),
                                          ("b.jpg", jpg), ("b.json", b'\xef\xbb\xbf {"label": 1, "label": 2, "z": -1.5e3}'),
                                          ("c.jpg", jpg), ("c.json", b'{"label": 3.0, "n": NaN}')])
    base = files["ustar.tar"]
    files["truncated_data.tar"] = base[:700]
    files["truncated_header.tar"] = base[:1200]
    files["bad_checksum.tar"] = base[:148] + b"0000000\0" + base[156:]
    files["huge_size.tar"] = base[:124] + b"\x80" + b"\x7f" * 11 + base[136:]
    return files


def main():
    for directory, files in ((NPY, npy_corpus()), (TOKENS, tokens_corpus()), (IMAGE, image_corpus()),
                             (TAR, tar_corpus())):
        os.makedirs(directory, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        print(f"{directory}: {len(files)} files, {sum(map(len, files.values()))} bytes")


if __name__ == "__main__":
    main()
