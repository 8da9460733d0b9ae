"""The reference's loops on every core: the values of TVM's serial loops, bit for bit."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from collage.measuring.arrays import numpy_outputs, random_inputs, to_tensors
from collage.measuring.build import REFERENCE_TARGET, reference_vm
from collage.measuring.parallel_loops import with_parallel_loops


# fmt: off
@I.ir_module
class Mixed:
    @R.function
    def main(x: R.Tensor((64, 128), "float32"), w: R.Tensor((128, 96), "float32"),
             image: R.Tensor((1, 8, 16, 16), "float32"), kernel: R.Tensor((4, 8, 3, 3), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            columns = R.sum(y, axis=[0])  # reduced over the leading axis
            c = R.nn.conv2d(image, kernel, padding=[1, 1, 1, 1])
            pooled = R.nn.max_pool2d(c, pool_size=[2, 2], strides=[2, 2])
            scanned = R.cumsum(x, axis=1)
            ordered = R.sort(y, axis=1)
            R.output(y, columns, pooled, scanned, ordered)
        return (y, columns, pooled, scanned, ordered)
# fmt: on


def serial(mod, target):
    return relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target(target)), tvm.cpu())


@pytest.mark.parametrize("target", [REFERENCE_TARGET, "llvm"], ids=["unoptimized", "optimized"])
def test_the_loops_run_in_parallel_and_compute_what_the_serial_loops_do(target):
    # ``reference_vm`` schedules a heavy model's (``llvm``); the rule itself holds for both.
    arrays = to_tensors(random_inputs(Mixed["main"], 0))
    parallel = numpy_outputs(reference_vm(Mixed, target)["main"](*arrays))
    expected = numpy_outputs(serial(Mixed, target)["main"](*arrays))
    for got, want in zip(parallel, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    lowered = with_parallel_loops(Mixed, tvm.target.Target(target))
    matmul = next(f for gv, f in lowered.functions.items() if gv.name_hint == "matmul")
    assert "T.parallel" in matmul.script()

