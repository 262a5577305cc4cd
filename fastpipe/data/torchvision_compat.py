"""A torchvision ``ImageFolder`` given to ``fastpipe.Loader`` as it is: its own sample list read by
:class:`fastpipe.ImageFolder`, and its transform pipeline turned into the fused image transform that does
the same thing (or an error naming the step that has no fused equivalent).

Understood, in torchvision's v1 and v2 spellings: ``Compose``; ``RandomResizedCrop`` and ``Resize`` (+
``CenterCrop``) with bilinear interpolation and antialiasing; ``CenterCrop``; ``RandomHorizontalFlip``;
``ToTensor``, ``PILToTensor``, ``ToImage``, ``ToDtype``/``ConvertImageDtype`` to float32, float16 or
bfloat16 (scaled) or uint8; ``Normalize``; the per-sample augmentations ``TrivialAugmentWide``,
``RandAugment``, ``AutoAugment``, ``AugMix`` (nearest or bilinear), ``ColorJitter``, ``RandomGrayscale``, ``GaussianBlur`` and
``RandomApply`` of them, on the uint8 image: after the crop and flip, before any float conversion; ``RandomErasing`` with a
value (not "random"), last.
"""

import torch

_SUPPORTED = ("Compose, RandomResizedCrop, Resize + CenterCrop, CenterCrop, RandomHorizontalFlip, "
              "TrivialAugmentWide/RandAugment/AutoAugment/AugMix/ColorJitter/RandomGrayscale/GaussianBlur/RandomApply, "
              "ToTensor, PILToTensor, ToImage, ToDtype/ConvertImageDtype, Normalize, RandomErasing (last)")
_AUGMENTS = ("TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix", "ColorJitter", "RandomGrayscale",
             "GaussianBlur", "RandomApply")


def is_torchvision_folder(dataset):
    """Whether ``dataset`` is torchvision's ImageFolder (or DatasetFolder of images)."""
    return any(c.__module__.startswith("torchvision.datasets") and c.__name__ in ("ImageFolder", "DatasetFolder")
               for c in type(dataset).__mro__)


def _steps(transform):
    if transform is None:
        return []
    name = type(transform).__name__
    if name == "Compose" and type(transform).__module__.startswith("torchvision"):
        return [s for t in transform.transforms for s in _steps(t)]
    return [transform]


def _refuse(step, why):
    raise ValueError(f"fastpipe.Loader cannot fuse torchvision's {type(step).__name__} into its JPEG decode "
                     f"({why}). It fuses {_SUPPORTED}; use fastpipe.ImageFolder with "
                     f"fastpipe.transforms.RandomResizedCrop/CenterCrop and apply the rest to the batch")


def _bilinear_antialiased(step):
    mode = getattr(step.interpolation, "value", step.interpolation)
    if mode != "bilinear":
        _refuse(step, f"interpolation={mode!r}: only bilinear is fused")
    if step.antialias is False:
        _refuse(step, "antialias=False: the fused resize is antialiased, as torchvision's default")


def _augment(step):
    """The fastpipe form of one of torchvision's per-sample augmentations."""
    from fastpipe import augment

    name = type(step).__name__
    if name == "ColorJitter":
        return augment.ColorJitter(*(v if v is not None else 0 for v in (step.brightness, step.contrast,
                                                                         step.saturation, step.hue)))
    if name == "RandomGrayscale":
        return augment.RandomGrayscale(step.p)
    if name == "GaussianBlur":
        try:
            return augment.GaussianBlur(tuple(step.kernel_size), tuple(step.sigma))
        except ValueError as e:
            _refuse(step, str(e))
    if name == "RandomApply":
        inner = [s for t in step.transforms for s in _steps(t)]
        for t in inner:
            if type(t).__name__ not in _AUGMENTS[:-1] or not type(t).__module__.startswith("torchvision"):
                _refuse(step, f"it holds {type(t).__name__}: RandomApply is fused around the augmentations only")
        return augment.RandomApply([_augment(t) for t in inner], p=float(step.p))
    fill = step.fill
    if isinstance(fill, dict):
        _refuse(step, "a fill per input type")
    try:
        if name == "TrivialAugmentWide":
            ours = augment.TrivialAugmentWide(step.num_magnitude_bins, step.interpolation, fill)
        elif name == "RandAugment":
            ours = augment.RandAugment(step.num_ops, step.magnitude, step.num_magnitude_bins, step.interpolation, fill)
        elif name == "AugMix":
            ours = augment.AugMix(step.severity, step.mixture_width, step.chain_depth, step.alpha, step.all_ops,
                                  step.interpolation, fill)
        else:
            ours = augment.AutoAugment(step.policy, step.interpolation, fill)
    except ValueError as e:
        _refuse(step, str(e))
    # v1 blends a bilinear fill in another order (transforms/_functional_tensor.py's _apply_grid_transform).
    ours.v1_fill = not type(step).__module__.startswith("torchvision.transforms.v2")
    return ours


def convert_transform(transform):
    """The fused transform (fastpipe.transforms.RandomResizedCrop or CenterCrop) doing what a torchvision
    pipeline does to a PIL image; ValueError naming the step it cannot fuse."""
    from fastpipe import transforms as ft

    geometry, resize, mirror, dtype, scaled, mean, std, erase = None, None, 0.0, None, False, None, None, None
    augmented = []
    for step in _steps(transform):
        name = type(step).__name__
        if not type(step).__module__.startswith("torchvision"):
            _refuse(step, "not a torchvision transform")
        if erase is not None:
            _refuse(step, "after RandomErasing: fastpipe erases the finished output, as torchvision's recipes "
                          "place RandomErasing last")
        if geometry is None and name == "Resize":
            _bilinear_antialiased(step)
            if getattr(step, "max_size", None) is not None:
                _refuse(step, "max_size is not supported")
            size = step.size
            if isinstance(size, (list, tuple)) and len(size) == 1:
                size = size[0]
            resize = tuple(size) if isinstance(size, (list, tuple)) else int(size)
        elif geometry is None and name == "RandomResizedCrop":
            if resize is not None:
                _refuse(step, "a Resize before it")
            _bilinear_antialiased(step)
            geometry = ("random", tuple(step.size), tuple(step.scale), tuple(step.ratio))
        elif geometry is None and name == "CenterCrop":
            geometry = ("center", tuple(step.size), resize)
        elif name == "RandomHorizontalFlip" and not augmented:
            mirror = float(step.p)
        elif name in _AUGMENTS and geometry is not None and dtype in (None, torch.uint8):
            augmented.append(_augment(step))
        elif name in ("ToTensor",) and dtype is None:
            dtype, scaled = torch.float32, True
        elif name in ("PILToTensor", "ToImage") and dtype is None:
            dtype = torch.uint8
        elif name in ("ToDtype", "ConvertImageDtype") and dtype is not None:
            target = step.dtype
            if isinstance(target, dict):
                _refuse(step, "a dtype per input type")
            if target != torch.uint8 and target not in (torch.float32, torch.float16, torch.bfloat16):
                _refuse(step, f"dtype {target}")
            scaled = target != torch.uint8 and (name == "ConvertImageDtype" or step.scale or scaled)
            if target != torch.uint8 and not scaled:
                _refuse(step, "an unscaled float conversion (values 0-255): use scale=True")
            dtype = target
        elif name == "Normalize" and dtype is not None and dtype != torch.uint8 and mean is None:
            mean, std = list(step.mean), list(step.std)
        elif name == "RandomErasing" and dtype is not None:
            value = step.value
            if value is None or isinstance(value, str):  # v2 keeps "random" as None
                _refuse(step, "value='random' (per-pixel noise)")
            value = [float(v) for v in value] if isinstance(value, (list, tuple)) else float(value)
            erase = ft.RandomErasing(step.p, tuple(step.scale), tuple(step.ratio), value)
        else:
            _refuse(step, "not supported here, or not at this place in the pipeline")
    if geometry is None:
        raise ValueError("fastpipe.Loader needs the torchvision pipeline to make every image the same size "
                         "(RandomResizedCrop, or Resize + CenterCrop, or CenterCrop); its images differ in size")
    if dtype is None:
        raise ValueError("the torchvision pipeline returns PIL images: end it with ToTensor(), or ToImage() + "
                         "ToDtype(...), for batches of tensors")
    common = dict(mean=mean, std=std, out_dtype=dtype, mirror=mirror, augment=augmented or None, erase=erase)
    if geometry[0] == "random":
        return ft.RandomResizedCrop(geometry[1], scale=geometry[2], ratio=geometry[3], **common)
    return ft.CenterCrop(geometry[1], resize=geometry[2], **common)


def convert_dataset(dataset):
    """fastpipe.ImageFolder reading the same files as torchvision's ``dataset``, with its transform fused."""
    from torchvision.datasets.folder import default_loader

    from fastpipe.data.images import ImageFolder

    if getattr(dataset, "target_transform", None) is not None:
        raise ValueError("fastpipe.Loader cannot apply a torchvision target_transform: labels are the class "
                         "indices; map them in the training loop")
    if getattr(dataset, "loader", default_loader) is not default_loader:
        raise ValueError("fastpipe.Loader reads torchvision ImageFolders that use the default (PIL) loader; "
                         "this one has a custom loader")
    transform = convert_transform(getattr(dataset, "transform", None))
    # Its own list: whatever its root (relative ones too), extensions, is_valid_file or a subclass's filter.
    return ImageFolder(dataset.root, transform=transform, samples=list(dataset.samples),
                       classes=list(dataset.classes))
