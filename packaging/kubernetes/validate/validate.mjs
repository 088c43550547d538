// Validates what `kubectl kustomize` renders from one overlay, offline (scripts/k8s-check.sh runs it):
//  1. every object against the Kubernetes schema of its apiVersion/kind (the kubernetes-models package: the
//     OpenAPI schemas of the Kubernetes API, compiled); an unknown apiVersion/kind is an error;
//  2. what OptiFlow's deployment relies on (docs/deploy.md), so that a regression in the manifests fails CI: the
//     native sidecar, /dev/shm shared in memory, the plugin delivery, probes on /healthz, non-root, the images.
//
// node validate.mjs --modules DIR --overlay sidecar|dev|daemonset --version X.Y.Z --params NAME,... FILE
//   DIR: where `npm ci` put node_modules (build/k8s-check); FILE: the rendered multi-document YAML;
//   --params: the OPTIFLOW_* variables the plugins know (plugin/include/optiflow/plugin/params.h).
// Exit 0 when everything holds; 1 with one line per problem ("<Kind>/<name>: ...") otherwise; 2 on bad usage.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

function usage(message) {
  console.error(`validate.mjs: ${message}`);
  console.error("usage: node validate.mjs --modules DIR --overlay NAME --version X.Y.Z --params A,B,... FILE");
  process.exit(2);
}

const opts = { modules: null, overlay: null, version: null, params: null, file: null };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  const key = a.startsWith("--") ? a.slice(2) : null;
  if (key !== null && key in opts && key !== "file") {
    if (i + 1 >= process.argv.length) usage(`${a} needs a value`);
    opts[key] = process.argv[++i];
  } else if (key === null && opts.file === null) {
    opts.file = a;
  } else {
    usage(`unexpected argument '${a}'`);
  }
}
for (const k of Object.keys(opts)) if (opts[k] === null) usage(`missing ${k === "file" ? "FILE" : "--" + k}`);
if (!["sidecar", "dev", "daemonset"].includes(opts.overlay)) usage(`unknown overlay '${opts.overlay}'`);

const require = createRequire(path.join(path.resolve(opts.modules), "node_modules", "_"));
let yaml;
try {
  yaml = require("js-yaml");
  require.resolve("kubernetes-models/v1");
} catch (e) {
  usage(`cannot load js-yaml/kubernetes-models from ${opts.modules}/node_modules (${e.message}); run npm ci there`);
}

const problems = [];
const where = (obj) => `${obj?.kind ?? "?"}/${obj?.metadata?.name ?? "?"}`;
const fail = (obj, message) => problems.push(`${where(obj)}: ${message}`);

let docs;
try {
  docs = yaml.loadAll(fs.readFileSync(opts.file, "utf8")).filter((d) => d !== null && d !== undefined);
} catch (e) {
  console.error(`${opts.file}: not YAML: ${e.message}`);
  process.exit(1);
}
if (docs.length === 0) {
  console.error(`${opts.file}: no objects`);
  process.exit(1);
}

// 1. Schemas. kubernetes-models has one module per group/version ("v1", "batch/v1", "apps/v1") exporting a class
// per kind; validate() throws with the JSON path of every violation.
for (const obj of docs) {
  if (typeof obj !== "object" || Array.isArray(obj)) {
    problems.push(`${opts.file}: a document that is not an object`);
    continue;
  }
  if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
    fail(obj, "no apiVersion or kind");
    continue;
  }
  let Model;
  try {
    Model = require(`kubernetes-models/${obj.apiVersion}`)[obj.kind];
  } catch {
    Model = undefined;
  }
  if (typeof Model !== "function") {
    fail(obj, `unknown apiVersion/kind ${obj.apiVersion}/${obj.kind}: no schema to check it against`);
    continue;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    fail(obj, `schema: ${e.message}`);
  }
}

// 2. What the deployment relies on.
const byKind = (kind) => docs.filter((d) => d?.kind === kind);
const configMaps = byKind("ConfigMap");
const knownParams = new Set(opts.params.split(",").filter((s) => s.length > 0));

function configMapNamed(name) {
  return configMaps.find((c) => c.metadata?.name === name);
}

// The config the daemon mounts: [metrics] port (the probes' port) and the namespace.
function daemonConfig(obj, podSpec, container) {
  const mount = (container.volumeMounts ?? []).find((m) => m.mountPath === "/etc/optiflow");
  if (!mount) return fail(obj, `${container.name}: /etc/optiflow is not mounted (the config)`), null;
  const volume = (podSpec.volumes ?? []).find((v) => v.name === mount.name);
  const cm = volume?.configMap ? configMapNamed(volume.configMap.name) : undefined;
  const text = cm?.data?.["optiflowd.toml"];
  if (typeof text !== "string") {
    return fail(obj, `${container.name}: /etc/optiflow is not a ConfigMap with optiflowd.toml`), null;
  }
  if (!(container.args ?? []).join(" ").includes("--config /etc/optiflow/optiflowd.toml")) {
    fail(obj, `${container.name}: args do not pass --config /etc/optiflow/optiflowd.toml`);
  }
  const metrics = /^\[metrics\]([\s\S]*?)(^\[|(?![\s\S]))/m.exec(text)?.[1] ?? "";
  const port = Number(/^port\s*=\s*(\d+)/m.exec(metrics)?.[1] ?? 9464);
  const address = /^address\s*=\s*"([^"]*)"/m.exec(metrics)?.[1] ?? "127.0.0.1";
  if (address.startsWith("127.") || address === "localhost" || address === "::1") {
    fail(obj, `${container.name}: [metrics] address = "${address}": the kubelet's probes cannot reach it`);
  }
  return { port };
}

// The value a container sees for an env variable: its env, else a ConfigMap of its envFrom.
function envValue(container, name) {
  const e = (container.env ?? []).find((v) => v.name === name);
  if (e) return e.value;
  for (const from of container.envFrom ?? []) {
    const cm = from.configMapRef ? configMapNamed(from.configMapRef.name) : undefined;
    if (cm?.data && name in cm.data) return cm.data[name];
  }
  return undefined;
}
function envNames(container) {
  const names = (container.env ?? []).map((v) => v.name);
  for (const from of container.envFrom ?? []) {
    const cm = from.configMapRef ? configMapNamed(from.configMapRef.name) : undefined;
    names.push(...Object.keys(cm?.data ?? {}));
  }
  return names;
}

function checkImage(obj, container) {
  const image = container.image ?? "";
  if (!/^[a-z0-9.-]+(:[0-9]+)?\/.+:[A-Za-z0-9._-]+$/.test(image)) {
    fail(obj, `${container.name}: image '${image}' is not registry/name:tag (a kustomize images: entry missing?)`);
  }
  if (image.includes("/optiflow/optiflow:") && !image.endsWith(`:${opts.version}`)) {
    fail(obj, `${container.name}: image '${image}' is not tagged with the project version ${opts.version}`);
  }
}

function checkHardened(obj, container, { readOnlyRoot }) {
  const sc = container.securityContext ?? {};
  if (sc.allowPrivilegeEscalation !== false) fail(obj, `${container.name}: allowPrivilegeEscalation is not false`);
  if (!(sc.capabilities?.drop ?? []).includes("ALL")) fail(obj, `${container.name}: capabilities do not drop ALL`);
  if (readOnlyRoot && sc.readOnlyRootFilesystem !== true) {
    fail(obj, `${container.name}: readOnlyRootFilesystem is not true`);
  }
  if (sc.runAsUser === 0 || sc.runAsNonRoot === false) fail(obj, `${container.name}: runs as root`);
}

function checkPodNonRoot(obj, podSpec) {
  const sc = podSpec.securityContext ?? {};
  if (sc.runAsNonRoot !== true) fail(obj, "pod securityContext.runAsNonRoot is not true");
  if (!(Number.isInteger(sc.runAsUser) && sc.runAsUser > 0)) fail(obj, "pod securityContext.runAsUser is not non-zero");
  if (!Number.isInteger(sc.fsGroup)) fail(obj, "pod securityContext.fsGroup is not set (the cache's group)");
  if (podSpec.hostIPC === true) fail(obj, "hostIPC: the cache is shared through a /dev/shm volume, not the host's IPC");
}

// The daemon: probes on /healthz at the config's metrics port, resource limits, the cache at /dev/shm.
function checkDaemon(obj, podSpec, daemon, shmVolume) {
  const cfg = daemonConfig(obj, podSpec, daemon);
  for (const kind of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const probe = daemon[kind];
    if (!probe?.httpGet) {
      fail(obj, `${daemon.name}: no ${kind} with httpGet`);
      continue;
    }
    if (probe.httpGet.path !== "/healthz") fail(obj, `${daemon.name}: ${kind} path is not /healthz`);
    const p = probe.httpGet.port;
    const port = typeof p === "number" ? p : (daemon.ports ?? []).find((x) => x.name === p)?.containerPort;
    if (port === undefined) fail(obj, `${daemon.name}: ${kind} port '${p}' is not a container port`);
    else if (cfg && port !== cfg.port) fail(obj, `${daemon.name}: ${kind} port ${port} != [metrics] port ${cfg.port}`);
  }
  const limits = daemon.resources?.limits ?? {};
  if (!limits.cpu || !limits.memory) fail(obj, `${daemon.name}: no cpu and memory limits`);
  if (!(daemon.resources?.requests?.cpu && daemon.resources?.requests?.memory)) {
    fail(obj, `${daemon.name}: no cpu and memory requests`);
  }
  checkHardened(obj, daemon, { readOnlyRoot: true });
  const stateDir = envValue(daemon, "OPTIFLOW_STATE_DIR");
  if (!stateDir || !(daemon.volumeMounts ?? []).some((m) => m.mountPath === stateDir)) {
    fail(obj, `${daemon.name}: OPTIFLOW_STATE_DIR is not a mounted volume (the root file system is read-only)`);
  }
  if (shmVolume && !mountsAt(daemon, shmVolume.name, "/dev/shm")) {
    fail(obj, `${daemon.name}: volume ${shmVolume.name} is not mounted at /dev/shm`);
  }
}

function mountsAt(container, volumeName, mountPath) {
  return (container.volumeMounts ?? []).some((m) => m.name === volumeName && m.mountPath === mountPath);
}

// The training container: plugins on its library path, the tuner selected, the same namespace as the daemon, and no
// OPTIFLOW_* variable the plugins do not know (they warn about those: a typo).
function checkTraining(obj, podSpec, training, shmVolume, daemonNamespace) {
  checkHardened(obj, training, { readOnlyRoot: false });
  if (!mountsAt(training, shmVolume.name, "/dev/shm")) {
    fail(obj, `${training.name}: volume ${shmVolume.name} is not mounted at /dev/shm`);
  }
  if (envValue(training, "NCCL_TUNER_PLUGIN") !== "optiflow") fail(obj, `${training.name}: NCCL_TUNER_PLUGIN != optiflow`);
  const ldPath = (envValue(training, "LD_LIBRARY_PATH") ?? "").split(":");
  const libMount = (training.volumeMounts ?? []).find((m) => m.mountPath === "/opt/optiflow/lib");
  if (!libMount) fail(obj, `${training.name}: nothing mounted at /opt/optiflow/lib (the plugins)`);
  if (ldPath[0] !== "/opt/optiflow/lib") fail(obj, `${training.name}: LD_LIBRARY_PATH does not start with /opt/optiflow/lib`);
  // The plugins arrive through a regular init container that writes the same volume and runs before the others.
  const copier = (podSpec.initContainers ?? []).find(
    (c) => c.restartPolicy !== "Always" && libMount && (c.volumeMounts ?? []).some((m) => m.name === libMount.name),
  );
  if (!copier) {
    fail(obj, `${training.name}: no regular init container fills the plugin volume`);
  } else {
    const cmd = [...(copier.command ?? []), ...(copier.args ?? [])].join(" ");
    for (const lib of ["libnccl-tuner-optiflow.so", "libnccl-net-optiflow.so"]) {
      if (!cmd.includes(lib)) fail(obj, `${copier.name}: does not copy ${lib}`);
    }
    if (podSpec.initContainers[0] !== copier) fail(obj, `${copier.name}: is not the first init container`);
    checkHardened(obj, copier, { readOnlyRoot: true });
  }
  const ns = envValue(training, "OPTIFLOW_NAMESPACE") ?? "default";
  if (daemonNamespace !== undefined && ns !== daemonNamespace) {
    fail(obj, `${training.name}: OPTIFLOW_NAMESPACE=${ns}, the daemon serves ${daemonNamespace}`);
  }
  for (const name of envNames(training)) {
    if (name.startsWith("OPTIFLOW_") && !knownParams.has(name)) {
      fail(obj, `${training.name}: ${name} is not a variable the plugins read (params.h); they would warn`);
    }
  }
}

const jobs = byKind("Job");
if (jobs.length !== 1) problems.push(`expected one training Job, found ${jobs.length}`);
for (const job of jobs) {
  const spec = job.spec?.template?.spec ?? {};
  checkPodNonRoot(job, spec);
  const training = (spec.containers ?? []).find((c) => c.name === "training");
  if (!training) {
    fail(job, "no container named training");
    continue;
  }
  const shmMount = (training.volumeMounts ?? []).find((m) => m.mountPath === "/dev/shm");
  const shmVolume = (spec.volumes ?? []).find((v) => v.name === shmMount?.name);
  if (!shmVolume) {
    fail(job, "training: no volume at /dev/shm");
    continue;
  }
  const sidecar = (spec.initContainers ?? []).find((c) => c.name === "optiflowd");
  let daemonNamespace;
  if (opts.overlay === "daemonset") {
    if (sidecar) fail(job, "the daemonset variant's Job still has the optiflowd sidecar");
    if (shmVolume.hostPath?.path !== "/dev/shm" || shmVolume.hostPath?.type !== "Directory") {
      fail(job, `volume ${shmVolume.name}: not hostPath /dev/shm (type Directory), the node's daemon cannot serve it`);
    }
    const ds = byKind("DaemonSet")[0];
    const d = ds?.spec?.template?.spec?.containers?.find((c) => c.name === "optiflowd");
    if (d) daemonNamespace = envValue(d, "OPTIFLOW_NAMESPACE") ?? "default";
  } else {
    if (!sidecar) {
      fail(job, "no init container named optiflowd (the sidecar)");
    } else {
      if (sidecar.restartPolicy !== "Always") {
        fail(job, "optiflowd: restartPolicy is not Always, so it is not a native sidecar (Kubernetes >= 1.29)");
      }
      checkDaemon(job, spec, sidecar, shmVolume);
      daemonNamespace = envValue(sidecar, "OPTIFLOW_NAMESPACE") ?? "default";
    }
    if (shmVolume.emptyDir?.medium !== "Memory") fail(job, `volume ${shmVolume.name} at /dev/shm: not emptyDir medium Memory`);
    if (spec.restartPolicy === "Always") fail(job, "pod restartPolicy Always: a Job's pod must be Never or OnFailure");
  }
  checkTraining(job, spec, training, shmVolume, daemonNamespace);
  for (const c of [...(spec.initContainers ?? []), ...(spec.containers ?? [])]) checkImage(job, c);
}

const daemonSets = byKind("DaemonSet");
if (opts.overlay === "daemonset") {
  if (daemonSets.length !== 1) problems.push(`expected one DaemonSet, found ${daemonSets.length}`);
  for (const ds of daemonSets) {
    const spec = ds.spec?.template?.spec ?? {};
    checkPodNonRoot(ds, spec);
    const d = (spec.containers ?? []).find((c) => c.name === "optiflowd");
    if (!d) {
      fail(ds, "no container named optiflowd");
      continue;
    }
    const shmMount = (d.volumeMounts ?? []).find((m) => m.mountPath === "/dev/shm");
    const shmVolume = (spec.volumes ?? []).find((v) => v.name === shmMount?.name);
    if (shmVolume?.hostPath?.path !== "/dev/shm" || shmVolume?.hostPath?.type !== "Directory") {
      fail(ds, "optiflowd: /dev/shm is not the node's (hostPath /dev/shm, type Directory)");
    }
    checkDaemon(ds, spec, d, shmVolume);
    checkImage(ds, d);
    if (spec.hostNetwork === true) fail(ds, "hostNetwork: the daemon needs no host network");
    if (spec.nodeSelector?.["nvidia.com/gpu.present"] !== "true") fail(ds, 'no nodeSelector nvidia.com/gpu.present: "true"');
    if (!(spec.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu")) fail(ds, "no toleration for nvidia.com/gpu");
  }
} else if (daemonSets.length !== 0) {
  problems.push(`the ${opts.overlay} overlay has a DaemonSet: one daemon per pod is the sidecar's job`);
}

if (problems.length > 0) {
  for (const p of problems) console.error(`${opts.file}: ${p}`);
  process.exit(1);
}
console.log(`${opts.file}: ${docs.length} objects valid (${docs.map(where).join(", ")})`);
