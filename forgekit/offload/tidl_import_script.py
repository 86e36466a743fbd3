"""Run TI's TIDL import on one ONNX model: forgekit starts this file with the Python of TI's tools.

TI's onnxruntime build (``onnxruntime-tidl``, Python 3.10, from TI's download site) compiles a model for
TIDL when a session opens with its ``TIDLCompilationProvider`` and calibration frames run through it
(edgeai-tidl-tools, examples/osrt_python/ort/onnxrt_ep.py, "compile" mode).  This script does exactly
that and nothing else, with only the standard library, numpy and TI's onnxruntime, because it runs in TI's
environment, not forgekit's: it imports nothing from forgekit.

    python tidl_import_script.py MODEL.onnx OPTIONS.json CALIB.npz
"""

import json
import sys


def main(argv):
    if len(argv) != 3:
        print("usage: tidl_import_script.py MODEL.onnx OPTIONS.json CALIB.npz", file=sys.stderr)
        return 2
    import numpy as np
    import onnxruntime as rt

    model, options_path, calib_path = argv
    with open(options_path) as f:
        options = json.load(f)
    if "TIDLCompilationProvider" not in rt.get_available_providers():
        print("this onnxruntime has no TIDLCompilationProvider: it is not TI's onnxruntime-tidl", file=sys.stderr)
        return 3
    so = rt.SessionOptions()
    so.log_severity_level = 3
    session = rt.InferenceSession(model, providers=["TIDLCompilationProvider", "CPUExecutionProvider"],
                                  provider_options=[options, {}], sess_options=so)
    frames = np.load(calib_path)
    names = [i.name for i in session.get_inputs()]
    count = int(frames["__count__"])
    for k in range(count):
        session.run(None, {n: frames[f"{n}__{k}"] for n in names})
    print(f"TIDL import ran {count} calibration frame(s); artifacts in {options['artifacts_folder']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
