"""The images suite's rows: every loader it runs, what it reads, and the row each is compared with.

Every row yields the same training batches: ``[B, 3, S, S]`` NCHW float32 and int64 labels. The plain
rows make them with RandomResizedCrop(S) + horizontal flip + ImageNet normalisation; the recipe rows
(``*_recipe``) with torchvision's reference train recipe on top (RECIPE: + TrivialAugmentWide after the
flip, bilinear as the references pass it, + RandomErasing(0.1) last), and its --interpolation bicubic form
(``*_recipe_bicubic``: the crop and TrivialAugmentWide bicubic), on the JPEG corpus, each compared with
DataLoader + torchvision v2 running that recipe.
"""

from __future__ import annotations

from typing import NamedTuple

RECIPE = "RandomResizedCrop + flip + TrivialAugmentWide (bilinear) + normalise + RandomErasing(p=0.1)"


class LoaderRow(NamedTuple):
    label: str
    needs: str | None  # the module that must be importable (None: fastpipe itself)
    source: str  # which files it reads: "tree", "packed" or "beton"
    note: str


LOADERS = {
    "fastpipe_folder": LoaderRow("fastpipe ImageFolder (in place)", None, "tree",
                                 "fastpipe.ImageFolder(tree) + Loader(num_threads=k, "
                                 "transforms={0: RandomResizedCrop})"),
    "fastpipe_packed": LoaderRow("fastpipe ImageDataset (packed)", None, "packed",
                                 "fastpipe.write_images(tree) -> ImageDataset: the original JPEG bytes in one file"),
    "dl_pil": LoaderRow("DataLoader + v2 on PIL", "torchvision", "tree",
                        "DataLoader(num_workers=k) + torchvision ImageFolder (PIL) + transforms.v2: the baseline"),
    "dl_decode_jpeg": LoaderRow("DataLoader + decode_jpeg + v2", "torchvision", "tree",
                                "DataLoader(num_workers=k) + torchvision.io.decode_jpeg(read_file) + v2 on tensors"),
    "fastpipe_recipe": LoaderRow("fastpipe ImageFolder, TA recipe", None, "tree",
                                 "fastpipe.ImageFolder(tree) + Loader(transforms={0: RandomResizedCrop(..., "
                                 "augment=TrivialAugmentWide(interpolation='bilinear'), erase=RandomErasing(0.1))})"),
    "dl_pil_recipe": LoaderRow("DataLoader + v2 on PIL, TA recipe", "torchvision", "tree",
                               "the DataLoader baseline with v2.TrivialAugmentWide(interpolation=BILINEAR) after "
                               "the flip and v2.RandomErasing(0.1) last: torchvision's reference recipe"),
    "fastpipe_recipe_bicubic": LoaderRow("fastpipe ImageFolder, TA recipe bicubic", None, "tree",
                                         "the fastpipe recipe row with interpolation='bicubic' for the crop and "
                                         "TrivialAugmentWide (the references' --interpolation bicubic)"),
    "dl_pil_recipe_bicubic": LoaderRow("DataLoader + v2 on PIL, TA recipe bicubic", "torchvision", "tree",
                                       "the DataLoader recipe row with InterpolationMode.BICUBIC for "
                                       "RandomResizedCrop and TrivialAugmentWide"),
    "dali_cpu": LoaderRow("DALI CPU pipeline", "nvidia.dali", "tree",
                          "DALI readers.file + decoders.image_random_crop + resize + crop_mirror_normalize, "
                          "device_id=None"),
    "ffcv": LoaderRow("FFCV (.beton, re-encoded q90)", "ffcv", "beton",
                      "FFCV Loader over a .beton written with RGBImageField(write_mode='jpg', jpeg_quality=90): "
                      "FFCV re-encodes every image (it cannot keep the original bytes)"),
}
BASELINE = "dl_pil"
# Rows that read only the JPEG corpus: they cannot read the other formats as they are.
JPEG_ONLY = {"dl_decode_jpeg": "torchvision.io.decode_jpeg reads JPEGs only",
             "fastpipe_recipe": "the recipe rows run on the JPEG corpus",
             "dl_pil_recipe": "the recipe rows run on the JPEG corpus",
             "fastpipe_recipe_bicubic": "the recipe rows run on the JPEG corpus",
             "dl_pil_recipe_bicubic": "the recipe rows run on the JPEG corpus",
             "ffcv": "FFCV's .beton re-encodes every image as a JPEG: not the same input"}
# The recipe rows: compared with the baseline running the same recipe, and with their own plain row
# (what the augmentations cost).
BASELINE_OF = {"fastpipe_recipe": "dl_pil_recipe", "dl_pil_recipe": "dl_pil_recipe",
               "fastpipe_recipe_bicubic": "dl_pil_recipe_bicubic", "dl_pil_recipe_bicubic": "dl_pil_recipe_bicubic"}
PLAIN_OF = {"fastpipe_recipe": "fastpipe_folder", "dl_pil_recipe": "dl_pil",
            "fastpipe_recipe_bicubic": "fastpipe_folder", "dl_pil_recipe_bicubic": "dl_pil"}
