"""Stand-ins for the outside world that tests and benchmarks drive over real sockets."""

from tests.fakes.fault_server import FaultKind, FaultRates, FaultServer, FaultServerStats

__all__ = ["FaultKind", "FaultRates", "FaultServer", "FaultServerStats"]
