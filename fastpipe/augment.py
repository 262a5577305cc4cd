"""torchvision's per-sample augmentations fused into the JPEG transforms: ``RandomResizedCrop(224,
augment=TrivialAugmentWide())`` (or RandAugment, AutoAugment, AugMix), or a list of them in order, e.g. ``augment=[RandomApply([ColorJitter(0.4,
0.4, 0.4, 0.1)], p=0.8), RandomGrayscale(0.2)]``. Each sample's ops run on its output-sized uint8 image
(224x224, not the original) in the reader threads (or a CUDA loader's kernel), right after the resize,
then the normalisation and RandomErasing.

The ops compute what torchvision's tensor kernels compute (``torchvision.transforms.v2.functional`` on
uint8 tensors: truncating blends, nearest or bilinear affine sampling with ``fill`` outside (bicubic:
grid_sample's, which torchvision's tensor kernels refuse for these ops), rounded as
the torch in use rounds it (fastpipe/torch_rounding.py); GaussianBlur to within a level); the automatic
augmentations' magnitudes are torchvision's own tables, read from torchvision (which TrivialAugmentWide,
RandAugment and AutoAugment therefore need). Which ops a sample gets is drawn as torchvision draws it,
from the hash of (seed, epoch, sample) rather than torch's generator: the same in any run, on any number
of threads. csrc/kernels/augment_ops.h and augment_draws.h.
"""

import numbers

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.torch_rounding import affine_rounding

__all__ = ["AugMix", "AutoAugment", "ColorJitter", "GaussianBlur", "RandAugment", "RandomApply", "RandomGrayscale",
           "TrivialAugmentWide"]

# csrc/kernels/augment_ops.h's AugOp names, in its order.
OPS = _C.AUGMENT["ops"]
# ColorJitter's, RandomGrayscale's and GaussianBlur's ops, reported by torchvision's functional names with
# their factor (GaussianBlur: its sigma).
FACTOR_OPS = {"Brightness": "adjust_brightness", "Contrast": "adjust_contrast", "Color": "adjust_saturation",
              "Hue": "adjust_hue", "Grayscale": "rgb_to_grayscale", "Blur": "gaussian_blur"}
# augment_draws.h's AugmentStageKind, and its limits.
_ONE_OF, _SUB_POLICY, _COLOR_JITTER, _GRAYSCALE, _BLUR, _AUGMIX = (
    _C.AUGMENT["stage_kinds"][k] for k in ("one_of", "sub_policy", "color_jitter", "grayscale", "blur", "augmix"))
_MAX_STAGES, _MAX_CANDIDATES, _MAX_MAGNITUDES, _MAX_OPS, _MAX_BLUR_TAPS, _MAX_CHAINS = (
    _C.AUGMENT[k] for k in ("max_stages", "max_candidates", "max_magnitudes", "max_ops", "max_blur_taps", "max_chains"))


def _torchvision_v2():
    try:
        from torchvision.transforms import v2
    except ImportError as e:
        import torch

        raise ImportError("fastpipe's TrivialAugmentWide, RandAugment, AutoAugment and AugMix take their op tables "
                          "from torchvision, which is not installed: pip install 'fastpipe[vision]' "
                          f"torch=={torch.__version__.split('+')[0]} (torch pinned to yours, so that pip picks "
                          "the torchvision made for it)") from e
    return v2


def _fill(fill):
    """torchvision's fill (None, a number, or one per channel) as 3 floats, or None."""
    if fill is None:
        return None
    values = [fill] if isinstance(fill, numbers.Real) else list(fill)
    if len(values) not in (1, 3):
        raise ValueError(f"fill needs 1 or 3 values (RGB), got {fill!r}")
    out = [checks.real(v, "fill", low=0.0, high=255.0) for v in values]
    return tuple(out * 3 if len(out) == 1 else out)


def _interpolation(interpolation):
    """'nearest', 'bilinear' or 'bicubic' from torchvision's InterpolationMode, its value or PIL's number."""
    mode = getattr(interpolation, "value", interpolation)
    mode = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(mode, mode)
    if mode not in ("nearest", "bilinear", "bicubic"):
        raise ValueError(f"interpolation={mode!r}: the fused geometric ops sample with 'nearest' (torchvision's "
                         f"default for them), 'bilinear' or 'bicubic'")
    return mode


class _Augment:
    """A stage of the augmentations: what it adds to the C++ parameters (augment_draws.h)."""

    def _samplings(self):
        """The (interpolation, fill, v1's fill blend) of the stage's geometric ops: [] where it has none."""
        return []

    def _add(self, height, width, table):
        """Appends this stage's dicts to table.stages (and its candidates and magnitudes to the _Table)."""
        raise NotImplementedError


class _Table:
    """The C++ parameters of a list of stages being built."""

    def __init__(self):
        self.stages, self.candidates, self.magnitudes, self.gates = [], [], [], 0

    def add_candidates(self, candidates):
        """Appends [(op, signed, p, [magnitudes])]; returns (first, count)."""
        first = len(self.candidates)
        for name, signed, p, magnitudes in candidates:
            self.candidates.append((OPS.index(name), bool(signed), float(p), len(self.magnitudes), len(magnitudes)))
            self.magnitudes.extend(magnitudes)
        return first, len(candidates)


def augment_params(augment, height, width):
    """The ImageTransformParams keywords of ``augment`` (a stage or a list of them) on an output of
    height x width."""
    stages = list(augment) if isinstance(augment, (list, tuple)) else [augment]
    for s in stages:
        if not isinstance(s, _Augment):
            raise TypeError(f"augment must be fastpipe.transforms' TrivialAugmentWide, RandAugment, AutoAugment, "
                            f"AugMix, ColorJitter, RandomGrayscale, GaussianBlur or RandomApply, or a list of them; "
                            f"got {type(s).__name__}")
    samplings = {x for s in stages for x in s._samplings()}
    if len(samplings) > 1:
        raise ValueError(f"augment: the stages' fills differ, or their interpolations ({sorted(samplings, key=str)}): "
                         f"one interpolation and fill for every geometric op")
    geometric = bool(samplings)
    interpolation, fill, v1 = samplings.pop() if geometric else ("nearest", None, False)
    table = _Table()
    for s in stages:
        s._add(height, width, table)
    if sum(st["kind"] == _BLUR for st in table.stages) > 1:
        raise ValueError("augment: at most one GaussianBlur")
    most = sum(_most_ops(st) for st in table.stages)
    if most > _MAX_OPS:
        raise ValueError(f"augment: at most {_MAX_OPS} ops a sample in all, these stages draw up to {most}")
    if len(table.stages) > _MAX_STAGES:
        raise ValueError(f"augment: at most {_MAX_STAGES} stages, got {len(table.stages)}")
    if len(table.candidates) > _MAX_CANDIDATES or len(table.magnitudes) > _MAX_MAGNITUDES:
        raise ValueError(f"augment: at most {_MAX_MAGNITUDES} magnitudes in all (num_magnitude_bins up to 46), got "
                         f"{len(table.magnitudes)}")
    # Nearest sampling stores the fill rounded (grid_sample's round_()); bilinear blends the floats.
    return dict(augment_stages=table.stages, augment_candidates=table.candidates,
                augment_magnitudes=table.magnitudes, augment_fill=[round(v) for v in fill or (0, 0, 0)],
                augment_interpolation=interpolation, augment_blend=0 if fill is None else 2 if v1 else 1,
                augment_fill_value=list(fill or (0.0, 0.0, 0.0)),
                augment_rounding=affine_rounding(height, width) if geometric else (True, True, True))


def _most_ops(stage):
    """The most ops a stage's dict draws for a sample."""
    kind = stage["kind"]
    if kind == _ONE_OF:
        return stage["num_ops"]
    if kind == _SUB_POLICY:
        return 2
    if kind == _COLOR_JITTER:
        return sum(r is not None for r in stage["ranges"])
    if kind == _AUGMIX:  # the mixing steps and every chain at its deepest
        return 1 + stage["mixture_width"] * ((stage["chain_depth"] if stage["chain_depth"] > 0 else 3) + 1)
    return 1


def _space_tables(space, num_bins, height, width):
    """A torchvision _AUGMENTATION_SPACE as [(op, signed, 1.0, [magnitudes])], every bin."""
    out = []
    for name, (magnitudes_fn, signed) in space.items():
        m = magnitudes_fn(num_bins, height, width)
        out.append((name, signed, 1.0, [] if m is None else [float(v) for v in m]))
    return out


class _Geometric(_Augment):
    """An automatic augmentation, whose shear, translate and rotate sample the image with `interpolation`
    and bring in `fill` from outside."""

    def __init__(self, interpolation, fill):
        _torchvision_v2()  # its op tables are read when the Loader is built: say it is missing here, where it is named
        self.interpolation = _interpolation(interpolation)
        self.fill_value = _fill(fill)
        self.v1_fill = False  # the converter's: torchvision v1's blend of a bilinear fill

    @property
    def fill(self):
        """The fill as the 3 uint8 values nearest sampling stores (None: 0)."""
        return [round(v) for v in self.fill_value or (0, 0, 0)]

    def _samplings(self):
        return [(self.interpolation, self.fill_value, self.v1_fill and self.fill_value is not None)]

    def _args(self):
        fill = "" if self.fill_value is None else f", fill={list(self.fill_value)}"
        return f"interpolation={self.interpolation!r}{fill}"


class TrivialAugmentWide(_Geometric):
    """torchvision's ``TrivialAugmentWide``: per sample one of its 14 ops, with a magnitude bin drawn
    uniformly (and a random sign where the op is signed).

    Parameters
    ----------
    num_magnitude_bins : int
        As torchvision's (31).
    interpolation : "nearest", "bilinear" or "bicubic"
        Of the geometric ops (torchvision's default is nearest; the classification references pass
        theirs, bilinear or bicubic), their positions and sums rounded as the torch in use rounds
        torchvision's (fastpipe/torch_rounding.py). Bicubic is grid_sample's (a = -0.75) on the tensor
        ops' grid, clamped: torchvision's tensor kernels refuse bicubic for these ops, and its PIL ones
        sample at other pixel centres with PIL's own cubic.
    fill : None, number or 3 numbers
        The pixels a geometric op brings in from outside the image (None: 0, and bilinear sampling blends
        with zeros at the edges, as torchvision's).
    """

    def __init__(self, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self.num_magnitude_bins = checks.integer(num_magnitude_bins, "num_magnitude_bins", low=2)
        super().__init__(interpolation, fill)

    def _add(self, height, width, table):
        space = _torchvision_v2().TrivialAugmentWide._AUGMENTATION_SPACE
        first, count = table.add_candidates(_space_tables(space, self.num_magnitude_bins, height, width))
        table.stages.append(dict(kind=_ONE_OF, num_ops=1, first=first, count=count))

    def __repr__(self):
        return f"TrivialAugmentWide(num_magnitude_bins={self.num_magnitude_bins}, {self._args()})"


class RandAugment(_Geometric):
    """torchvision's ``RandAugment``: per sample ``num_ops`` ops, each one of its 14 drawn uniformly, at
    bin ``magnitude`` of ``num_magnitude_bins`` (a random sign where the op is signed).

    Parameters
    ----------
    num_ops : int
        Ops per sample, 0 to 16.
    magnitude, num_magnitude_bins : int
        As torchvision's (9 of 31).
    interpolation, fill
        As :class:`TrivialAugmentWide`'s.
    """

    def __init__(self, num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self.num_ops = checks.integer(num_ops, "num_ops", low=0, high=_MAX_OPS)
        self.num_magnitude_bins = checks.integer(num_magnitude_bins, "num_magnitude_bins", low=2)
        self.magnitude = checks.integer(magnitude, "magnitude", low=0, high=self.num_magnitude_bins - 1)
        super().__init__(interpolation, fill)

    def _add(self, height, width, table):
        space = _torchvision_v2().RandAugment._AUGMENTATION_SPACE
        tables = _space_tables(space, self.num_magnitude_bins, height, width)
        first, count = table.add_candidates([(n, s, p, m[self.magnitude:self.magnitude + 1]) for n, s, p, m in tables])
        table.stages.append(dict(kind=_ONE_OF, num_ops=self.num_ops, first=first, count=count))

    def __repr__(self):
        return (f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, "
                f"num_magnitude_bins={self.num_magnitude_bins}, {self._args()})")


class AutoAugment(_Geometric):
    """torchvision's ``AutoAugment``: per sample one of the policy's 25 sub-policies, each of two ops
    applied with its probability at its magnitude (a random sign where the op is signed).

    Parameters
    ----------
    policy : "imagenet", "cifar10", "svhn" or torchvision's AutoAugmentPolicy
    interpolation, fill
        As :class:`TrivialAugmentWide`'s.
    """

    def __init__(self, policy="imagenet", interpolation="nearest", fill=None):
        name = getattr(policy, "value", policy)
        self.policy = checks.choice(str(name).lower(), "policy", ("imagenet", "cifar10", "svhn"))
        super().__init__(interpolation, fill)

    def _add(self, height, width, table):
        v2 = _torchvision_v2()
        tv = v2.AutoAugment(v2.AutoAugmentPolicy(self.policy))
        out = []
        for sub in tv._policies:
            for name, p, index in sub:
                magnitudes_fn, signed = tv._AUGMENTATION_SPACE[name]
                m = magnitudes_fn(10, height, width)
                out.append((name, signed, p, [] if m is None or index is None else [float(m[index])]))
        first, count = table.add_candidates(out)
        table.stages.append(dict(kind=_SUB_POLICY, first=first, count=count))

    def __repr__(self):
        return f"AutoAugment(policy={self.policy!r}, {self._args()})"


class AugMix(_Geometric):
    """torchvision's ``AugMix``: per sample ``mixture_width`` chains of ``chain_depth`` ops (-1: 1 to 3,
    drawn per chain), each op drawn uniformly from its 13 (``all_ops``) or 9 ops at one of the first
    ``severity`` of 10 magnitude bins (a random sign where the op is signed), each chain applied to the
    image; the image and the chains mixed with Dirichlet(alpha) weights in float32 and truncated to uint8,
    as torchvision computes it (its PIL input is a tensor there too).

    Parameters
    ----------
    severity : int
        1 to 10 (3).
    mixture_width : int
        Chains, 1 to 6 (3), with mixture_width x (chain_depth + 1) + 1 at most 16 (chain_depth -1 counts as 3).
    chain_depth : int
        Ops per chain; -1 (or 0): 1 to 3, drawn per chain.
    alpha : float
        The Dirichlet's concentration (1.0).
    all_ops : bool
        With brightness, colour, contrast and sharpness (True).
    interpolation, fill
        As :class:`TrivialAugmentWide`'s; AugMix's default is bilinear.
    """

    def __init__(self, severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True, interpolation="bilinear",
                 fill=None):
        self.severity = checks.integer(severity, "severity", low=1, high=10)
        self.mixture_width = checks.integer(mixture_width, "mixture_width", low=1, high=_MAX_CHAINS)
        depth = checks.integer(chain_depth, "chain_depth", high=_MAX_OPS - 2)
        self.chain_depth = depth if depth > 0 else -1  # torchvision draws 1 to 3 for any depth <= 0
        self.alpha = checks.real(alpha, "alpha", positive=True)
        self.all_ops = bool(all_ops)
        most = 1 + self.mixture_width * ((self.chain_depth if self.chain_depth > 0 else 3) + 1)
        if most > _MAX_OPS:
            raise ValueError(f"AugMix: mixture_width x (chain_depth + 1) + 1 must be at most {_MAX_OPS} "
                             f"(chain_depth -1 counts as 3), got {most}")
        super().__init__(interpolation, fill)

    def _add(self, height, width, table):
        tv = _torchvision_v2().AugMix
        space = tv._AUGMENTATION_SPACE if self.all_ops else tv._PARTIAL_AUGMENTATION_SPACE
        tables = _space_tables(space, 10, height, width)
        first, count = table.add_candidates([(n, s, p, m[:self.severity]) for n, s, p, m in tables])
        table.stages.append(dict(kind=_AUGMIX, first=first, count=count, chain_depth=self.chain_depth,
                                 mixture_width=self.mixture_width, alpha=self.alpha))

    def __repr__(self):
        return (f"AugMix(severity={self.severity}, mixture_width={self.mixture_width}, chain_depth={self.chain_depth}, "
                f"alpha={self.alpha}, all_ops={self.all_ops}, {self._args()})")


def _jitter_range(value, name, center, bound, clip_first_on_zero=True):
    """torchvision's ColorJitter._check_input: a number v is (center - v, center + v) (clipped at 0), a pair
    is itself; None where it leaves the image as it is."""
    if isinstance(value, numbers.Real):
        v = checks.real(value, name, low=0.0)
        value = [center - v, center + v]
        if clip_first_on_zero:
            value[0] = max(value[0], 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        value = [checks.real(v, f"{name}[{i}]") for i, v in enumerate(value)]
    else:
        raise TypeError(f"{name} must be a number or a (min, max) pair, got {value!r}")
    if not bound[0] <= value[0] <= value[1] <= bound[1]:
        raise ValueError(f"{name} values must be within {bound} with min <= max, got {value}")
    return None if value[0] == value[1] == center else (float(value[0]), float(value[1]))


class ColorJitter(_Augment):
    """torchvision's ``ColorJitter``: brightness, contrast, saturation and hue adjusted in a random order per
    sample, each by a factor drawn uniformly from its range (as torchvision takes them: a number v is
    [max(0, 1 - v), 1 + v], hue h is [-h, h] with h <= 0.5; 0 leaves it out)."""

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0):
        self.brightness = _jitter_range(brightness, "brightness", 1.0, (0.0, float("inf")))
        self.contrast = _jitter_range(contrast, "contrast", 1.0, (0.0, float("inf")))
        self.saturation = _jitter_range(saturation, "saturation", 1.0, (0.0, float("inf")))
        self.hue = _jitter_range(hue, "hue", 0.0, (-0.5, 0.5), clip_first_on_zero=False)

    def _add(self, height, width, table):
        table.stages.append(dict(kind=_COLOR_JITTER, ranges=[self.brightness, self.contrast, self.saturation,
                                                             self.hue]))

    def __repr__(self):
        return (f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, saturation={self.saturation}, "
                f"hue={self.hue})")


class RandomGrayscale(_Augment):
    """torchvision's ``RandomGrayscale``: with probability p, the image's grey (0.2989 R + 0.587 G + 0.114 B,
    truncated) in all three channels."""

    def __init__(self, p=0.1):
        self.p = checks.real(p, "p", low=0.0, high=1.0)

    def _add(self, height, width, table):
        table.stages.append(dict(kind=_GRAYSCALE, p=self.p))

    def __repr__(self):
        return f"RandomGrayscale(p={self.p})"


class GaussianBlur(_Augment):
    """torchvision's ``GaussianBlur``: a Gaussian kernel of ``kernel_size`` (odd, at most 47; an int or
    (x, y)) with sigma drawn uniformly from ``sigma`` per sample, reflect padding, rounded to uint8. Run
    as two 1-D passes (rows, then columns) where torchvision convolves with the 2-D kernel: the same
    weights, summed in another order, so a value can round to the next level where torchvision's lands
    within float rounding of a half."""

    def __init__(self, kernel_size, sigma=(0.1, 2.0)):
        sizes = [kernel_size, kernel_size] if isinstance(kernel_size, numbers.Integral) else list(kernel_size)
        if len(sizes) != 2:
            raise ValueError(f"kernel_size must be an int or (x, y), got {kernel_size!r}")
        for k in sizes:
            checks.integer(k, "kernel_size", low=1, high=_MAX_BLUR_TAPS)
            if k % 2 == 0:
                raise ValueError(f"kernel_size must be odd, got {kernel_size!r}")
        self.kernel_size = (int(sizes[0]), int(sizes[1]))
        sigma = [sigma, sigma] if isinstance(sigma, numbers.Real) else list(sigma)
        if len(sigma) != 2 or not 0.0 < float(sigma[0]) <= float(sigma[1]):
            raise ValueError(f"sigma must be positive, or (min, max) with 0 < min <= max, got {sigma!r}")
        self.sigma = (float(sigma[0]), float(sigma[1]))

    def _add(self, height, width, table):
        kx, ky = self.kernel_size
        if kx // 2 >= width or ky // 2 >= height:
            raise ValueError(f"GaussianBlur: a kernel of {self.kernel_size} needs an output of more than "
                             f"{ky // 2}x{kx // 2} (reflect padding), got {height}x{width}")
        table.stages.append(dict(kind=_BLUR, taps=(kx, ky), sigma=self.sigma))

    def __repr__(self):
        return f"GaussianBlur(kernel_size={self.kernel_size}, sigma={self.sigma})"


class RandomApply(_Augment):
    """torchvision's ``RandomApply``: its stages, in order, with probability p (one draw for them all)."""

    def __init__(self, transforms, p=0.5):
        self.transforms = list(transforms) if isinstance(transforms, (list, tuple)) else [transforms]
        for t in self.transforms:
            if not isinstance(t, _Augment) or isinstance(t, RandomApply):
                raise TypeError(f"RandomApply takes fastpipe.transforms' augmentations (not RandomApply), got "
                                f"{type(t).__name__}")
        self.p = checks.real(p, "p", low=0.0, high=1.0)

    def _samplings(self):
        return [x for t in self.transforms for x in t._samplings()]

    def _add(self, height, width, table):
        gate, table.gates = table.gates, table.gates + 1
        start = len(table.stages)
        for t in self.transforms:
            t._add(height, width, table)
        for st in table.stages[start:]:
            st["gate"], st["gate_p"] = gate, self.p

    def __repr__(self):
        return f"RandomApply({self.transforms}, p={self.p})"
