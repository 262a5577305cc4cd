"""The objects training scripts wrap their torchvision pipelines in, read through to the pipeline.

- A preset class of the script's own (torchvision's references/classification ``ClassificationPresetTrain``
  and ``ClassificationPresetEval``, and other projects' like them) holds a torchvision ``Compose`` in an
  attribute and only delegates to it. That it *only* delegates is proven from its source: a ``__call__``
  (or an ``nn.Module``'s ``forward``) of one argument whose body is ``return self.<attr>(x)`` (or
  ``x = self.<attr>(x)`` then ``return x``), without hooks. Anything else may do more than its attribute
  does, and stays an error naming it.
- torchvision's weight presets (``weights.transforms()``) are classes whose ``forward`` does the work itself:
  ``ImageClassification`` is read as the steps its ``forward`` runs (resize, centre crop, to tensor where
  the image is a PIL image, float, normalise), with its sizes, interpolation and antialias.
"""

import ast
import inspect
import textwrap

import torch

_WEIGHT_PRESETS = "torchvision.transforms._presets"


def is_torchvision(step):
    return type(step).__module__.startswith("torchvision")


def weight_preset_steps(step, image_is_pil):
    """The torchvision steps a weights preset runs, or None when ``step`` is not one; ValueError for the
    presets whose outputs differ in size (detection, segmentation) or are not images (video)."""
    if not type(step).__module__.startswith(_WEIGHT_PRESETS):
        return None
    from torchvision import transforms as T

    name = type(step).__name__
    if name != "ImageClassification":
        raise ValueError(f"fastpipe.Loader cannot fuse torchvision's weights preset {name}: only ImageClassification "
                         f"makes images of one size (a batch); apply {name} to each sample yourself")
    steps = [T.Resize(step.resize_size, interpolation=step.interpolation, antialias=step.antialias),
             T.CenterCrop(step.crop_size)]
    if image_is_pil:  # its forward converts PIL images only
        steps.append(T.PILToTensor())
    return steps + [T.ConvertImageDtype(torch.float), T.Normalize(step.mean, step.std)]


def _method_of(obj):
    """The method whose body decides what calling ``obj`` does: an nn.Module's forward, else __call__."""
    if isinstance(obj, torch.nn.Module):
        from torch.nn.modules import module as nn_module

        hooks = (obj._forward_hooks, obj._forward_pre_hooks, nn_module._global_forward_hooks,
                 nn_module._global_forward_pre_hooks)
        if any(hooks):
            return None, "it has forward hooks"
        if type(obj).__call__ is not torch.nn.Module.__call__:
            return None, "it overrides nn.Module.__call__"
        return type(obj).forward, "forward"
    method = getattr(type(obj), "__call__", None)
    if method is None or not inspect.isfunction(method):
        return None, "it is not callable in Python code"
    return method, "__call__"


def delegated(obj):
    """``(attribute name, what it holds)`` when calling ``obj`` only calls one of its attributes with the
    same argument and returns the result; else ``(None, why not)``."""
    method, name = _method_of(obj)
    if method is None:
        return None, name
    try:
        source = textwrap.dedent(inspect.getsource(method))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None, f"its {name}'s source is not available to prove that it only delegates"
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list:
        return None, f"its {name} is decorated or not a plain function"
    a = fn.args
    params = [p.arg for p in a.posonlyargs + a.args]
    if len(params) != 2 or a.vararg or a.kwarg or a.kwonlyargs:
        return None, f"its {name} does not take exactly one argument"
    this, arg = params
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring

    def call_of_attribute(node):
        """The attribute name when node is ``this.<attr>(arg)``."""
        if (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], ast.Name) and node.args[0].id == arg
                and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == this):
            return node.func.attr
        return None

    attr = None
    if len(body) == 1 and isinstance(body[0], ast.Return):
        attr = call_of_attribute(body[0].value)
    elif (len(body) == 2 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
          and isinstance(body[0].targets[0], ast.Name) and isinstance(body[1], ast.Return)
          and isinstance(body[1].value, ast.Name) and body[1].value.id == body[0].targets[0].id):
        attr = call_of_attribute(body[0].value)
    if attr is None:
        return None, f"its {name} does more than `return self.<attribute>({arg})`"
    try:
        return attr, getattr(obj, attr)
    except AttributeError:
        return None, f"its {name} calls self.{attr}, which it does not have"
