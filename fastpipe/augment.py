"""torchvision's automatic augmentations fused into the JPEG transforms: ``RandomResizedCrop(224,
augment=TrivialAugmentWide())``. Each sample's ops run on its output-sized uint8 image (224x224, not the
original) in the reader threads, right after the resize, then the normalisation and RandomErasing.

The ops compute what torchvision's tensor kernels compute (``torchvision.transforms.v2.functional`` on
uint8 tensors: truncating blends, nearest affine sampling with ``fill`` outside); their magnitudes are
torchvision's own tables, read from torchvision (which these classes therefore need). Which ops a sample
gets is drawn as torchvision draws it, from the hash of (seed, epoch, sample) rather than torch's
generator: the same in any run, on any number of threads. csrc/cuda/augment_ops.h and augment_draws.h.
"""

import numbers

from fastpipe import _checks as checks

__all__ = ["AutoAugment", "RandAugment", "TrivialAugmentWide"]

# The order of csrc/cuda/augment_ops.h's AugOp.
OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
       "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
_POLICIES = {"one_of": 1, "sub_policy": 2}
_MAX_CANDIDATES, _MAX_MAGNITUDES, _MAX_OPS = 50, 512, 8


def _torchvision_v2():
    try:
        from torchvision.transforms import v2
    except ImportError as e:
        raise ImportError("fastpipe's TrivialAugmentWide, RandAugment and AutoAugment take their magnitude tables "
                          "from torchvision: pip install torchvision") from e
    return v2


def _fill(fill):
    """torchvision's fill (None: 0; a number; one per channel) as the 3 uint8 values the output gets."""
    if fill is None:
        return [0, 0, 0]
    values = [fill] if isinstance(fill, numbers.Real) else list(fill)
    if len(values) not in (1, 3):
        raise ValueError(f"fill needs 1 or 3 values (RGB), got {fill!r}")
    out = [round(checks.real(v, "fill", low=0.0, high=255.0)) for v in values]  # grid_sample's round_()
    return out * 3 if len(out) == 1 else out


def _interpolation(interpolation):
    mode = getattr(interpolation, "value", interpolation)
    if mode not in ("nearest", 0):
        raise ValueError(f"interpolation={mode!r}: the fused augmentations sample with 'nearest' (torchvision's "
                         f"default for them)")


class _Augment:
    """What the three share: the C++ parameters (policy, candidates, magnitudes, fill)."""

    def _tables(self, height, width):
        """(policy, num_ops, [(op, signed, p, [magnitudes])]) for an output of height x width."""
        raise NotImplementedError

    def _params(self, height, width):
        policy, num_ops, candidates = self._tables(height, width)
        flat, table = [], []
        for name, signed, p, magnitudes in candidates:
            table.append((OPS.index(name), bool(signed), float(p), len(flat), len(magnitudes)))
            flat.extend(magnitudes)
        if len(table) > _MAX_CANDIDATES or len(flat) > _MAX_MAGNITUDES:
            raise ValueError(f"{type(self).__name__}: at most {_MAX_MAGNITUDES} magnitudes in all "
                             f"(num_magnitude_bins up to 46), got {len(flat)}")
        return dict(augment_policy=_POLICIES[policy], augment_num_ops=num_ops, augment_candidates=table,
                    augment_magnitudes=flat, augment_fill=self.fill)


def _space_tables(space, num_bins, height, width):
    """A torchvision _AUGMENTATION_SPACE as [(op, signed, 1.0, [magnitudes])], every bin."""
    out = []
    for name, (magnitudes_fn, signed) in space.items():
        m = magnitudes_fn(num_bins, height, width)
        out.append((name, signed, 1.0, [] if m is None else [float(v) for v in m]))
    return out


class TrivialAugmentWide(_Augment):
    """torchvision's ``TrivialAugmentWide``: per sample one of its 14 ops, with a magnitude bin drawn
    uniformly (and a random sign where the op is signed).

    Parameters
    ----------
    num_magnitude_bins : int
        As torchvision's (31).
    interpolation : "nearest"
        Of the geometric ops (torchvision's default; others are refused).
    fill : None, number or 3 numbers
        The pixels a geometric op brings in from outside the image (None: 0).
    """

    def __init__(self, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self.num_magnitude_bins = checks.integer(num_magnitude_bins, "num_magnitude_bins", low=2)
        _interpolation(interpolation)
        self.fill = _fill(fill)

    def _tables(self, height, width):
        space = _torchvision_v2().TrivialAugmentWide._AUGMENTATION_SPACE
        return "one_of", 1, _space_tables(space, self.num_magnitude_bins, height, width)

    def __repr__(self):
        return f"TrivialAugmentWide(num_magnitude_bins={self.num_magnitude_bins}, fill={self.fill})"


class RandAugment(_Augment):
    """torchvision's ``RandAugment``: per sample ``num_ops`` ops, each one of its 14 drawn uniformly, at
    bin ``magnitude`` of ``num_magnitude_bins`` (a random sign where the op is signed).

    Parameters
    ----------
    num_ops : int
        Ops per sample, 0 to 8.
    magnitude, num_magnitude_bins : int
        As torchvision's (9 of 31).
    interpolation, fill
        As :class:`TrivialAugmentWide`'s.
    """

    def __init__(self, num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self.num_ops = checks.integer(num_ops, "num_ops", low=0, high=_MAX_OPS)
        self.num_magnitude_bins = checks.integer(num_magnitude_bins, "num_magnitude_bins", low=2)
        self.magnitude = checks.integer(magnitude, "magnitude", low=0, high=self.num_magnitude_bins - 1)
        _interpolation(interpolation)
        self.fill = _fill(fill)

    def _tables(self, height, width):
        space = _torchvision_v2().RandAugment._AUGMENTATION_SPACE
        tables = _space_tables(space, self.num_magnitude_bins, height, width)
        return "one_of", self.num_ops, [(n, s, p, m[self.magnitude:self.magnitude + 1]) for n, s, p, m in tables]

    def __repr__(self):
        return (f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, "
                f"num_magnitude_bins={self.num_magnitude_bins}, fill={self.fill})")


class AutoAugment(_Augment):
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
        _interpolation(interpolation)
        self.fill = _fill(fill)

    def _tables(self, height, width):
        v2 = _torchvision_v2()
        tv = v2.AutoAugment(v2.AutoAugmentPolicy(self.policy))
        out = []
        for sub in tv._policies:
            for name, p, index in sub:
                magnitudes_fn, signed = tv._AUGMENTATION_SPACE[name]
                m = magnitudes_fn(10, height, width)
                out.append((name, signed, p, [] if m is None or index is None else [float(m[index])]))
        return "sub_policy", 2, out

    def __repr__(self):
        return f"AutoAugment(policy={self.policy!r}, fill={self.fill})"
