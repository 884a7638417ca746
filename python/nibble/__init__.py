"""nibble: block-wise INT4/INT8 weight quantization of ONNX LLMs.

    import nibble
    model = nibble.quantize("in/model.onnx", calibration_method="awq_lite",
                            calibration_data_reader=reader, output_path="out/model.onnx")

`quantize` has the signature and defaults of ModelOpt 0.47's `modelopt.onnx.quantization.int4.quantize`
and runs the `nibble quantize` command line; the command is also installed as `nibble`.
"""
from ._api import NibbleError, quantize

__all__ = ["NibbleError", "quantize"]
__version__ = "0.1.0"
