"""KServe's official gRPC client stubs, from the `kserve` package on PyPI
(installed without its dependencies into build/venv by `make deps`): the
generated kserve/protocol/grpc/grpc_predict_v2_pb2.py (messages) and
grpc_predict_v2_pb2_grpc.py (GRPCInferenceServiceStub), never ferry's own
copy of the proto.

Two things keep them from being imported as they stand, and both are worked
around without changing what the stubs are:
- `import kserve` runs the package's __init__, which needs KServe's whole
  server (FastAPI, Kubernetes, pandas, ...): the two generated modules are
  read from their files instead.
- tritonclient's stubs (test_tritonclient.py, the same pytest process) put
  the same message names (inference.*) into protobuf's default pool, where a
  second file defining them is refused: the messages are built from KServe's
  serialized file descriptor - the bytes its _pb2 module would add - in a
  pool of their own, and the official _pb2_grpc module is executed against
  them.

Triton's extensions ferry serves (ModelStreamInfer's response, ModelConfig,
ModelStatistics) are not in KServe's proto: their messages are declared here
as Triton's grpc_service.proto and model_config.proto define them (names and
field numbers), cut down to what ferry fills. test_tritonclient.py checks the
same RPCs through tritonclient's own stubs.
"""

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

KSERVE_HOW = "the `kserve` package is missing from this python: run `make deps` (it installs it into build/venv)"

TRITON_CONFIG_PROTO = """syntax = "proto3";
package inference;
message ModelConfigRequest { string name = 1; string version = 2; }
enum DataType { TYPE_INVALID = 0; TYPE_INT64 = 9; TYPE_FP32 = 11; }
message ModelVersionPolicy {
  message Latest { uint32 num_versions = 1; }
  oneof policy_choice { Latest latest = 1; }
}
message ModelInput { string name = 1; DataType data_type = 2; repeated int64 dims = 4; }
message ModelOutput { string name = 1; DataType data_type = 2; repeated int64 dims = 3; }
message ModelTransactionPolicy { bool decoupled = 1; }
message ModelConfig {
  string name = 1; string platform = 2; ModelVersionPolicy version_policy = 3; int32 max_batch_size = 4;
  repeated ModelInput input = 5; repeated ModelOutput output = 6; string backend = 17;
  ModelTransactionPolicy model_transaction_policy = 19;
}
message ModelConfigResponse { ModelConfig config = 1; }
message ModelStatisticsRequest { string name = 1; string version = 2; }
message StatisticDuration { uint64 count = 1; uint64 ns = 2; }
message InferStatistics {
  StatisticDuration success = 1; StatisticDuration fail = 2; StatisticDuration queue = 3;
  StatisticDuration compute_input = 4; StatisticDuration compute_infer = 5; StatisticDuration compute_output = 6;
}
message InferBatchStatistics { uint64 batch_size = 1; }
message ModelStatistics {
  string name = 1; string version = 2; uint64 last_inference = 3; uint64 inference_count = 4;
  uint64 execution_count = 5; InferStatistics inference_stats = 6; repeated InferBatchStatistics batch_stats = 7;
}
message ModelStatisticsResponse { repeated ModelStatistics model_stats = 1; }
"""

PB2 = "grpc_predict_v2_pb2"
PB2_PACKAGE = "kserve.protocol.grpc"


def kserve_dir():
    """kserve/protocol/grpc of the installed package (found, not imported)."""
    spec = importlib.util.find_spec("kserve")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(KSERVE_HOW, pytrace=False)
    d = Path(list(spec.submodule_search_locations)[0]) / "protocol" / "grpc"
    if not (d / (PB2 + ".py")).is_file():
        pytest.fail("%s: no %s.py there (%s)" % (d, PB2, KSERVE_HOW), pytrace=False)
    return d


def serialized_descriptor(pb2_path):
    """The FileDescriptorProto bytes a generated _pb2 module passes to
    AddSerializedFile (a literal in its source)."""
    for node in ast.walk(ast.parse(pb2_path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "AddSerializedFile" and node.args):
            return ast.literal_eval(node.args[0])
    raise AssertionError("%s: no AddSerializedFile(...) call" % pb2_path)


def _namespace(fd):
    ns = {n: message_factory.GetMessageClass(d) for n, d in fd.message_types_by_name.items()}
    ns.update({n: enum_type_wrapper.EnumTypeWrapper(e) for n, e in fd.enum_types_by_name.items()})
    ns["DESCRIPTOR"] = fd
    return ns


def _stream_file():
    """Triton's ModelStreamInferResponse{error_message = 1, infer_response = 2}
    over KServe's ModelInferResponse."""
    f = descriptor_pb2.FileDescriptorProto(name="triton_stream.proto", package="inference", syntax="proto3",
                                           dependency=["grpc_predict_v2.proto"])
    m = f.message_type.add(name="ModelStreamInferResponse")
    F = descriptor_pb2.FieldDescriptorProto
    m.field.add(name="error_message", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="errorMessage")
    m.field.add(name="infer_response", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                type_name=".inference.ModelInferResponse", json_name="inferResponse")
    return f


def _config_file(out):
    from grpc_tools import protoc  # grpcio-tools, in build/venv
    (out / "triton_config.proto").write_text(TRITON_CONFIG_PROTO)
    desc = out / "triton_config.desc"
    rc = protoc.main(["grpc_tools.protoc", "-I", str(out), "--descriptor_set_out=%s" % desc,
                      str(out / "triton_config.proto")])
    assert rc == 0, "grpc_tools.protoc failed on triton_config.proto"
    (f,) = descriptor_pb2.FileDescriptorSet.FromString(desc.read_bytes()).file
    return f


def _official_stub(d, messages):
    """GRPCInferenceServiceStub from kserve's own _pb2_grpc.py, its `from
    kserve.protocol.grpc import grpc_predict_v2_pb2` answered with the
    messages of the private pool (sys.modules restored afterwards)."""
    pkgs = ["kserve", "kserve.protocol", PB2_PACKAGE]
    names = pkgs + [PB2_PACKAGE + "." + PB2]
    saved = {n: sys.modules.get(n) for n in names}
    try:
        for n in pkgs:
            sys.modules[n] = types.ModuleType(n)
            sys.modules[n].__path__ = []
        mod = types.ModuleType(PB2_PACKAGE + "." + PB2)
        mod.__dict__.update(messages)
        sys.modules[mod.__name__] = mod
        sys.modules[PB2_PACKAGE].grpc_predict_v2_pb2 = mod
        spec = importlib.util.spec_from_file_location("kserve_grpc_predict_v2_pb2_grpc",
                                                      d / (PB2 + "_grpc.py"))
        grpc_mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(grpc_mod)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return grpc_mod.GRPCInferenceServiceStub


def load(out):
    """(messages, GRPCInferenceServiceStub, ModelStreamInferResponse, Triton's
    config and statistics messages); out: a scratch directory."""
    d = kserve_dir()
    pool = descriptor_pool.DescriptorPool()
    kfile = descriptor_pb2.FileDescriptorProto.FromString(serialized_descriptor(d / (PB2 + ".py")))
    files = {}
    for f in (kfile, _stream_file(), _config_file(Path(out))):
        pool.Add(f)
        files[f.name] = pool.FindFileByName(f.name)
    messages = _namespace(files[kfile.name])
    stub = _official_stub(d, messages)
    stream = _namespace(files["triton_stream.proto"])["ModelStreamInferResponse"]
    config = types.SimpleNamespace(**_namespace(files["triton_config.proto"]))
    return types.SimpleNamespace(**messages), stub, stream, config
