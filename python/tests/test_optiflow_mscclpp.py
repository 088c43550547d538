"""optiflow_mscclpp against a fake `mscclpp` module that records registrations and answers like MSCCL++ v0.10's
Python API (mscclpp.ext.AlgorithmCollectionBuilder, mscclpp._mscclpp.CppExecutionPlan,
mscclpp._core.algorithm.Algorithm), and a fake torch.distributed. With OPTIFLOW_CLI set (ctest sets it), a real
plan directory from `optiflow synthesize` + `optiflow export mscclpp` is registered too."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import unittest

import optiflow_mscclpp as om


class FakeMscclpp:
    """Installs modules named `<prefix>`, `<prefix>.ext`, `<prefix>._mscclpp`, `<prefix>._core.algorithm`."""

    def __init__(self, prefix="fake_mscclpp", version="0.10.0"):
        self.prefix = prefix
        self.plans = []  # (path, rank)
        self.added = []  # Algorithm objects
        self.selectors = []
        rec = self

        root = types.ModuleType(prefix)
        root.__version__ = version
        ext = types.ModuleType(prefix + ".ext")
        native = types.ModuleType(prefix + "._mscclpp")
        core = types.ModuleType(prefix + "._core")
        algorithm = types.ModuleType(prefix + "._core.algorithm")

        class CppExecutionPlan:
            def __init__(self, path, rank):
                if not os.path.exists(path):
                    raise RuntimeError(f"no plan at {path}")
                rec.plans.append((path, rank))
                self.path = path

        class Algorithm:
            class Constraint:
                def __init__(self, world_size=0, n_ranks_per_node=0):
                    self.world_size = world_size
                    self.n_ranks_per_node = n_ranks_per_node

            def __init__(self, id=None, execution_plan=None, native_handle=None, tags=None, constraint=None):
                self.id = id
                self.execution_plan = execution_plan
                self.tags = tags
                self.constraint = constraint

        class AlgorithmCollectionBuilder:
            def add_algorithm_builder(self, algo):
                rec.added.append(algo)

            def set_algorithm_selector(self, selector):
                rec.selectors.append(selector)

        native.CppExecutionPlan = CppExecutionPlan
        algorithm.Algorithm = Algorithm
        ext.AlgorithmCollectionBuilder = AlgorithmCollectionBuilder
        root.ext = ext
        self.modules = {
            prefix: root,
            prefix + ".ext": ext,
            prefix + "._mscclpp": native,
            prefix + "._core": core,
            prefix + "._core.algorithm": algorithm,
        }
        sys.modules.update(self.modules)
        self.root = root

    def remove(self):
        for name in self.modules:
            sys.modules.pop(name, None)


class Mode:
    def __init__(self, name):
        self.name = name


class Request:
    """What the shim passes (CppCollectiveRequest's fields)."""

    def __init__(self, collective, message_size, world_size=8, n_ranks_per_node=8, mode="IN_PLACE"):
        self.collective = collective
        self.message_size = message_size
        self.world_size = world_size
        self.n_ranks_per_node = n_ranks_per_node
        self.rank = 0
        self._mode = Mode(mode)

    def buffer_mode(self):
        return self._mode


class FakeDist:
    """torch.distributed as the guards see it: the collectives call the selector the way the shim would."""

    class ReduceOp:
        SUM = "ReduceOp.SUM"
        MAX = "ReduceOp.MAX"
        AVG = "ReduceOp.AVG"

    def __init__(self):
        self.group = types.SimpleNamespace(WORLD=object())
        self.selector = None
        self.last = "unset"
        self.next_request = None

    def _launch(self):
        self.last = self.selector({}, self.next_request) if self.selector else None
        return self.last

    def all_reduce(self, tensor, op=ReduceOp.SUM, group=None, async_op=False):
        return self._launch()

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, group=None, async_op=False):
        return self._launch()

    def all_gather_into_tensor(self, output, input, group=None, async_op=False):
        return self._launch()

    def broadcast(self, tensor, src, group=None, async_op=False):
        return self._launch()


def write_manifest(d, plans):
    for p in plans:
        with open(os.path.join(d, p["file"]), "w") as f:
            f.write("{}")
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump({"format": "optiflow-mscclpp-plans", "version": 1, "plans": plans}, f)


def plan(name, collective, lo, hi, in_place=True, world=8, per_node=8):
    return {
        "file": name + ".json",
        "name": name,
        "collective": collective,
        "world_size": world,
        "ranks_per_node": per_node,
        "in_place": in_place,
        "min_message_size": lo,
        "max_message_size": hi,
    }


class RegisterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="optiflow-mscclpp-py-")
        self.fake = FakeMscclpp()
        write_manifest(
            self.dir,
            [
                plan("ar-small", "allreduce", 0, 65535),
                plan("ar-large", "allreduce", 65536, 2**64 - 1),
                plan("ag-oop", "allgather", 0, 2**20, in_place=False),
                plan("rs-16", "reducescatter", 0, 2**30, world=16),
            ],
        )
        self.dist = FakeDist()
        self.selector = om.register(self.dir, rank=3, world_size=8, ranks_per_node=8, dist=self.dist,
                                    mscclpp_module=self.fake.root)
        self.dist.selector = self.fake.selectors[-1]

    def tearDown(self):
        self.fake.remove()
        shutil.rmtree(self.dir)

    def launch(self, call, req):
        self.dist.next_request = req
        return call()

    def test_registers_only_plans_for_this_job(self):
        self.assertEqual(sorted(a.id for a in self.fake.added), ["ag-oop", "ar-large", "ar-small"])
        self.assertTrue(all(rank == 3 for _, rank in self.fake.plans))
        self.assertEqual(self.fake.added[0].constraint.world_size, 8)
        self.assertEqual(self.fake.added[0].constraint.n_ranks_per_node, 8)
        self.assertEqual(len(self.fake.selectors), 1)

    def test_accepts_what_a_plan_was_made_for(self):
        got = self.launch(lambda: self.dist.all_reduce(None), Request("allreduce", 4096))
        self.assertEqual(got.id, "ar-small")
        got = self.launch(lambda: self.dist.all_reduce(None, op=FakeDist.ReduceOp.SUM), Request("allreduce", 1 << 20))
        self.assertEqual(got.id, "ar-large")
        # AllGather: the shim passes per-rank bytes; 8 x 128 KiB = 1 MiB is inside [0, 1 MiB].
        got = self.launch(lambda: self.dist.all_gather_into_tensor(None, None),
                          Request("allgather", 128 << 10, mode="OUT_OF_PLACE"))
        self.assertEqual(got.id, "ag-oop")
        self.assertEqual(self.selector.accepted, 3)

    def test_declines_everything_else(self):
        cases = [
            (lambda: self.dist.all_reduce(None, op=FakeDist.ReduceOp.MAX), Request("allreduce", 4096)),
            (lambda: self.dist.all_reduce(None, FakeDist.ReduceOp.AVG), Request("allreduce", 4096)),
            (lambda: self.dist.all_reduce(None, group=object()), Request("allreduce", 4096)),
            (lambda: self.dist.all_reduce(None), Request("allreduce", 4096, mode="OUT_OF_PLACE")),
            (lambda: self.dist.all_reduce(None), Request("allreduce", 4096, world_size=16)),
            (lambda: self.dist.all_reduce(None), Request("allreduce", 4096, n_ranks_per_node=4)),
            (lambda: self.dist.all_gather_into_tensor(None, None), Request("allgather", 256 << 10, mode="OUT_OF_PLACE")),
            (lambda: self.dist.all_gather_into_tensor(None, None), Request("allgather", 1024, mode="IN_PLACE")),
            (lambda: self.dist.reduce_scatter_tensor(None, None), Request("reducescatter", 4096)),
            (lambda: self.dist.broadcast(None, 0), Request("broadcast", 4096)),
            (lambda: self.dist.all_reduce(None), Request("alltoall", 4096)),
            (lambda: self.dist.all_reduce(None), Request("allreduce", 4096, mode="ANY")),
        ]
        for call, req in cases:
            with self.subTest(collective=req.collective, size=req.message_size):
                self.assertIsNone(self.launch(call, req))
        # A call that did not come through torch.distributed (no op, no group known) stays with NCCL.
        self.assertIsNone(self.fake.selectors[-1]({}, Request("allreduce", 4096)))
        self.assertEqual(self.selector.accepted, 0)

    def test_prefers_the_collection_entry(self):
        mine = object()
        with om.collective_context("allreduce", "sum", True):
            self.assertIs(self.selector({"allreduce": {"ar-small": mine}}, Request("allreduce", 1)), mine)

    def test_guards_are_installed_once(self):
        first = self.dist.all_reduce
        om.install_torch_guards(self.dist)
        self.assertIs(self.dist.all_reduce, first)


class ManifestTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="optiflow-mscclpp-py-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_rejects_overlapping_ranges_and_bad_files(self):
        write_manifest(self.dir, [plan("a", "allreduce", 0, 100), plan("b", "allreduce", 100, 200)])
        with self.assertRaisesRegex(ValueError, "overlap"):
            om.load_manifest(self.dir)
        with open(os.path.join(self.dir, "manifest.json"), "w") as f:
            f.write('{"format": "optiflow-mscclpp-plans", "version": 1, "plans": [{"file": "a.json"}]}')
        with self.assertRaisesRegex(ValueError, r"plans\[0\]"):
            om.load_manifest(self.dir)
        with open(os.path.join(self.dir, "manifest.json"), "w") as f:
            f.write("{")
        with self.assertRaisesRegex(ValueError, "manifest.json:1:2"):
            om.load_manifest(self.dir)
        with self.assertRaisesRegex(ValueError, "cannot read"):
            om.load_manifest(os.path.join(self.dir, "missing"))

    def test_version_is_pinned(self):
        fake = FakeMscclpp(prefix="fake_old_mscclpp", version="0.9.0")
        try:
            write_manifest(self.dir, [plan("a", "allreduce", 0, 100)])
            with self.assertRaisesRegex(RuntimeError, "0.10.0"):
                om.register(self.dir, 0, 8, 8, mscclpp_module=fake.root)
            self.assertEqual(fake.added, [])
        finally:
            fake.remove()


@unittest.skipUnless(os.environ.get("OPTIFLOW_CLI"), "OPTIFLOW_CLI is not set (ctest sets it)")
class RealExportTest(unittest.TestCase):
    def test_registers_a_real_export(self):
        cli = os.environ["OPTIFLOW_CLI"]
        d = tempfile.mkdtemp(prefix="optiflow-mscclpp-py-real-")
        fake = FakeMscclpp(prefix="fake_real_mscclpp")
        try:
            run = os.path.join(d, "run")
            subprocess.run([cli, "synthesize", "--topo", "dgx-a100", "--coll", "allgather", "--sizes", "4KiB,1MiB",
                            "--quiet", "--out", run], check=True, stdout=subprocess.DEVNULL)
            plans = os.path.join(d, "plans")
            subprocess.run([cli, "export", "mscclpp", run, "-o", plans], check=True, stdout=subprocess.DEVNULL)
            dist = FakeDist()
            selector = om.register(plans, rank=0, world_size=8, ranks_per_node=8, dist=dist,
                                   mscclpp_module=fake.root)
            self.assertEqual(len(fake.added), 4)  # two sizes x two buffer modes
            dist.selector = fake.selectors[-1]
            dist.next_request = Request("allgather", 512, mode="IN_PLACE")  # 8 x 512 B = 4 KiB
            got = dist.all_gather_into_tensor(None, None)
            self.assertIsNotNone(got)
            self.assertIn("allgather-4KiB-inplace", got.id)
            dist.next_request = Request("allgather", 1 << 20, mode="OUT_OF_PLACE")  # 8 MiB: the 1MiB entry's range
            self.assertIn("allgather-1MiB-outofplace", dist.all_gather_into_tensor(None, None).id)
            self.assertEqual(selector.accepted, 2)
        finally:
            fake.remove()
            shutil.rmtree(d)


if __name__ == "__main__":
    unittest.main()
