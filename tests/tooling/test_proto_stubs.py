"""The checked-in stubs in pinmq_pb are what `python -m pinmq.protogen` generates today."""

from pinmq import protogen


def test_checked_in_stubs_are_up_to_date() -> None:
    fresh = protogen.generated_texts()
    assert fresh, "no stubs generated"
    assert protogen.checked_in_texts() == fresh, "stale stubs: run `make proto`"


def test_stubs_import_package_qualified() -> None:
    grpc_module = protogen.generated_texts()["client_pb2_grpc.py"]
    assert "from pinmq_pb import client_pb2" in grpc_module
