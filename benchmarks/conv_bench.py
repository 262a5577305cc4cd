"""placeholder, replaced below"""
import collections

Row = collections.namedtuple("Row", "family name cin cout size kernel stride groups activation residual")

# The shapes: (family, label, C_in, C_out, H=W, kernel, stride, groups, activation, residual).
SHAPES = [
    Row("resnet50", "stem 7x7/2 3>64 @224", 3, 64, 224, 7, 2, 1, "relu", False),
    Row("resnet50", "3x3 64>64 @56", 64, 64, 56, 3, 1, 1, "relu", False),
    Row("resnet50", "1x1 64>256 @56 +res", 64, 256, 56, 1, 1, 1, "relu", True),
    Row("resnet50", "3x3 256>256 @14", 256, 256, 14, 3, 1, 1, "relu", False),
    Row("resnet50", "1x1 1024>256 @14", 1024, 256, 14, 1, 1, 1, "relu", False),
    Row("resnet50", "3x3 512>512 @7", 512, 512, 7, 3, 1, 1, "relu", False),
    Row("mobilenetv2", "dw3x3 32 @112", 32, 32, 112, 3, 1, 32, "relu6", False),
    Row("mobilenetv2", "dw3x3 144 @56", 144, 144, 56, 3, 1, 144, "relu6", False),
    Row("mobilenetv2", "dw3x3 192 @28", 192, 192, 28, 3, 1, 192, "relu6", False),
    Row("mobilenetv2", "dw3x3 576 @14", 576, 576, 14, 3, 1, 576, "relu6", False),
    Row("mobilenetv2", "dw3x3 960 @7", 960, 960, 7, 3, 1, 960, "relu6", False),
    Row("mobilenetv2", "dw3x3/2 96 @112", 96, 96, 112, 3, 2, 96, "relu6", False),
    Row("convnext", "dw7x7 96 @56", 96, 96, 56, 7, 1, 96, "gelu", False),
    Row("convnext", "dw7x7 384 @14", 384, 384, 14, 7, 1, 384, "gelu", False),
    Row("convnext", "1x1 96>384 @56", 96, 384, 56, 1, 1, 1, "gelu", False),
    Row("efficientnet", "dw5x5 240 @28", 240, 240, 28, 5, 1, 240, "silu", False),
]
