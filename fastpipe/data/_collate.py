"""DataLoader's ``collate_fn`` on fastpipe batches: ``default_collate`` is what the readers already do;
any other collate gets the per-sample list DataLoader would hand it, as views into the batch."""

from torch.utils.data._utils import collate as _torch_collate


def checked(collate_fn):
    """None when ``collate_fn`` is None or torch's default_collate (the batch as the readers build it),
    else the callable."""
    if collate_fn is None or collate_fn is _torch_collate.default_collate:
        return None
    if not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
    return collate_fn


def packer(dataset, collate_fn):
    """The function from what the reader's next() returns to what the loop receives; None where that is
    the batch already (the reader packs it: dataset._reader_pack)."""
    pack = dataset._pack if dataset._reader_pack == "list" else None
    items = dataset._items
    # An image dataset's (torchvision's CIFAR and MNIST converted too): the batch is (images, labels), and
    # the function takes each label as an int, as torchvision's datasets give it.
    target = getattr(dataset, "target_transform", None)
    if target is not None:
        if collate_fn is None:  # the images stay the batch's; the mapped labels are collated
            return lambda batch: (batch[0], _torch_collate.default_collate([target(y) for y in batch[1].tolist()]))
        return lambda batch: collate_fn([(x, target(int(y))) for x, y in items(batch)])
    if collate_fn is None:
        return pack
    if pack is None:
        return lambda batch: collate_fn(items(batch))
    return lambda tensors: collate_fn(items(pack(tensors)))


def items(batch):
    """A packed batch (a tensor, a tuple or a dict of tensors) as the list of its records, each a view."""
    if isinstance(batch, dict):
        n = len(next(iter(batch.values())))
        return [{k: v[i] for k, v in batch.items()} for i in range(n)]
    if isinstance(batch, tuple):
        return list(zip(*(t.unbind(0) for t in batch)))
    return list(batch.unbind(0))
