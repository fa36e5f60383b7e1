// Command client drives CSI node plugins from outside, as kubelet does, with the Go CSI
// bindings (github.com/container-storage-interface/spec/lib/go/csi, generated from
// csi-proto/proto/csi.proto), and compares Latchkey's warm NodePublishVolume with a minimal Go
// node plugin's (agent/benches/go-csi/plugin) in one run. scripts/bench-go-csi.sh builds and
// starts everything; agent/benches/go-csi/README.md says what is measured and how.
//
// Modes:
//
//	-mode bench           the side-by-side benchmark (default): one server or both
//	-mode publish         publish -count volumes on the one server given and leave them mounted
//	-mode unpublish       unpublish what -mode publish published (same -count and -prefix)
//	-write-manifests DIR  write the warm scenario's manifests for `latchkey node --manifests`
//	-free-port            print a free TCP port on 127.0.0.1
//
// The requests are those of agent/benches/publish.rs's warm scenario: namespace "bench",
// ExternalSecret "warm" (3 keys of 64 bytes from a fake store without latency), service
// account "default", a new pod (name, UID, target directory) per publish, read-only, a mount
// capability with SINGLE_NODE_WRITER. Both servers get the same requests; only the first
// component below the scratch directory differs ("go" or "lk", of equal length).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

const (
	namespace      = "bench"
	externalSecret = "warm"
	serviceAccount = "default"
	// publish.rs: WARM_FILES, VALUE_BYTES.
	warmFiles  = 3
	valueBytes = 64
	fileMode   = 0o444
	// USER_HZ: the unit of utime and stime in /proc/<pid>/stat (100 on every Linux ABI).
	clockTicks = 100
	tmpfsMagic = 0x01021994
	stNoSUID   = 0x2
	stNoDev    = 0x4
	stNoExec   = 0x8
)

// warmValues are the warm ExternalSecret's keys and values (publish.rs: warm_values).
func warmValues() [][2]string {
	out := make([][2]string, 0, warmFiles)
	for i := 0; i < warmFiles; i++ {
		seed := fmt.Sprintf("warm-value-%d-", i)
		out = append(out, [2]string{fmt.Sprintf("warm-%d", i), strings.Repeat(seed, valueBytes/len(seed)+1)[:valueBytes]})
	}
	return out
}

// manifests is the warm scenario's part of publish.rs's manifests, formatted the same way: the
// store "fast" without latency and the ExternalSecret "warm" naming its 3 keys.
func manifests() string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\napiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n"+
		"metadata: {name: fast, namespace: %s}\nspec:\n  provider:\n    fake:\n      data:\n", namespace)
	for _, kv := range warmValues() {
		fmt.Fprintf(&b, "      - {key: %s, value: %s}\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n"+
		"metadata: {name: %s, namespace: %s}\nspec:\n  secretStoreRef: {name: fast}\n  data:\n",
		externalSecret, namespace)
	for _, kv := range warmValues() {
		fmt.Fprintf(&b, "  - {secretKey: %s, remoteRef: {key: %s}}\n", kv[0], kv[0])
	}
	return b.String()
}

func fnv1a(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// volume is one pod's volume: what kubelet sends to publish and unpublish it.
type volume struct {
	parent, target string
	publish        *csi.NodePublishVolumeRequest
	unpublish      *csi.NodeUnpublishVolumeRequest
}

// newVolume builds the requests of latchkey::csi::client::PodVolume::new(namespace, pod,
// externalSecret).publish_request(volume_id_for(target), target) for target
// <root>/pods/<pod>/mount.
func newVolume(root, pod string) volume {
	target := filepath.Join(root, "pods", pod, "mount")
	id := fmt.Sprintf("csi-%016x", fnv1a(target))
	return volume{
		parent: filepath.Dir(target),
		target: target,
		publish: &csi.NodePublishVolumeRequest{
			VolumeId:   id,
			TargetPath: target,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
			Readonly: true,
			VolumeContext: map[string]string{
				"csi.storage.k8s.io/pod.name":            pod,
				"csi.storage.k8s.io/pod.namespace":       namespace,
				"csi.storage.k8s.io/pod.uid":             fmt.Sprintf("%016x", fnv1a(namespace+"/"+pod)),
				"csi.storage.k8s.io/serviceAccount.name": serviceAccount,
				"csi.storage.k8s.io/ephemeral":           "true",
				"externalSecret":                         externalSecret,
			},
		},
		unpublish: &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target},
	}
}

// server is one CSI endpoint under test.
type server struct {
	key    string // "go" or "lk": JSON key and directory below the scratch directory
	label  string
	socket string
	pid    int
	root   string

	conn     *grpc.ClientConn
	node     csi.NodeClient
	identity csi.IdentityClient
	perCall  bool // each timed call dials a connection of its own, as kubelet does
	next     int  // pods are named warm-<next>, the same sequence on both servers

	Plugin   map[string]string  `json:"plugin"`
	Idle     map[string]float64 `json:"idle_status_kib"`
	End      map[string]float64 `json:"end_status_kib"`
	Checks   []string           `json:"checks"`
	pub      []time.Duration
	unpub    []time.Duration
	probe    []time.Duration
	pubCPU   time.Duration
	unpubCPU time.Duration
	rounds   []roundResult
}

type roundResult struct {
	Round           int     `json:"round"`
	Position        int     `json:"position"`
	PublishMedianMs float64 `json:"publish_median_ms"`
	CPUPerPublishUs float64 `json:"cpu_per_publish_us"`
}

func dial(socket string) (*grpc.ClientConn, error) {
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}
	// grpc-go 1.33 has no unix:// resolver; a dialer is what the kubernetes-csi clients use.
	return grpc.Dial("passthrough:///csi.sock", grpc.WithInsecure(), grpc.WithContextDialer(dialer))
}

func (s *server) connect() error {
	conn, err := dial(s.socket)
	if err != nil {
		return err
	}
	s.conn = conn
	s.node = csi.NewNodeClient(conn)
	s.identity = csi.NewIdentityClient(conn)
	return nil
}

// callConn is the connection a timed call uses and what to run once it has answered (also when
// it failed): the shared one, or with -connection per-call a new one (dialled inside the timed
// span, as kubelet dials for every operation, and closed after it). A generated client is a
// struct around it: making one per call costs nothing measurable.
func (s *server) callConn() (*grpc.ClientConn, func(), error) {
	if !s.perCall {
		return s.conn, func() {}, nil
	}
	conn, err := dial(s.socket)
	if err != nil {
		return nil, func() {}, err
	}
	return conn, func() { conn.Close() }, nil
}

// waitReady polls Probe until the plugin says it is ready.
func (s *server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := s.identity.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && (resp.GetReady() == nil || resp.GetReady().GetValue()) {
			return nil
		}
		if err == nil {
			err = errors.New("Probe: not ready")
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s (%s) not ready after %s: %v", s.label, s.socket, timeout, last)
}

// describe asks the plugin who it is (after the idle RSS is taken).
func (s *server) describe() error {
	ctx := context.Background()
	info, err := s.identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return fmt.Errorf("GetPluginInfo: %w", err)
	}
	if _, err := s.identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{}); err != nil {
		return fmt.Errorf("GetPluginCapabilities: %w", err)
	}
	nodeInfo, err := s.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return fmt.Errorf("NodeGetInfo: %w", err)
	}
	caps, err := s.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		return fmt.Errorf("NodeGetCapabilities: %w", err)
	}
	var names []string
	for _, c := range caps.GetCapabilities() {
		names = append(names, c.GetRpc().GetType().String())
	}
	s.Plugin = map[string]string{
		"name": info.GetName(), "vendor_version": info.GetVendorVersion(),
		"node_id": nodeInfo.GetNodeId(), "node_capabilities": strings.Join(names, ","),
		"socket": s.socket, "pid": strconv.Itoa(s.pid),
	}
	return nil
}

// volumes makes the next n volumes of this server (untimed).
func (s *server) volumes(n int) []volume {
	out := make([]volume, n)
	for i := range out {
		out[i] = newVolume(s.root, fmt.Sprintf("warm-%d", s.next))
		s.next++
	}
	return out
}

func (s *server) publishAll(vols []volume, createParents bool) ([]time.Duration, error) {
	if createParents {
		// kubelet creates the pod's volume directory and hands over a missing target below it.
		for _, v := range vols {
			if err := os.MkdirAll(v.parent, 0o750); err != nil {
				return nil, err
			}
		}
	}
	ctx := context.Background()
	times := make([]time.Duration, 0, len(vols))
	for _, v := range vols {
		start := time.Now()
		conn, done, err := s.callConn()
		if err == nil {
			_, err = csi.NewNodeClient(conn).NodePublishVolume(ctx, v.publish)
		}
		elapsed := time.Since(start)
		done()
		if err != nil {
			return nil, fmt.Errorf("%s: NodePublishVolume %s: %w", s.label, v.target, err)
		}
		times = append(times, elapsed)
	}
	return times, nil
}

// probeAll times n Probe calls: the gRPC round trip of each server with no work behind it, so
// that the publish times can be read as round trip plus the publish's own work.
func (s *server) probeAll(n int) ([]time.Duration, error) {
	ctx := context.Background()
	times := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		conn, done, err := s.callConn()
		if err == nil {
			_, err = csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		}
		elapsed := time.Since(start)
		done()
		if err != nil {
			return nil, fmt.Errorf("%s: Probe: %w", s.label, err)
		}
		times = append(times, elapsed)
	}
	return times, nil
}

func (s *server) unpublishAll(vols []volume) ([]time.Duration, error) {
	ctx := context.Background()
	times := make([]time.Duration, 0, len(vols))
	for _, v := range vols {
		start := time.Now()
		conn, done, err := s.callConn()
		if err == nil {
			_, err = csi.NewNodeClient(conn).NodeUnpublishVolume(ctx, v.unpublish)
		}
		elapsed := time.Since(start)
		done()
		if err != nil {
			return nil, fmt.Errorf("%s: NodeUnpublishVolume %s: %w", s.label, v.target, err)
		}
		times = append(times, elapsed)
	}
	// The pod directories are kubelet's (or what the server made of them): not timed.
	for _, v := range vols {
		os.Remove(v.parent)
	}
	return times, nil
}

// cycle publishes and then unpublishes n volumes; the server's CPU time is read around each
// phase.
func (s *server) cycle(n int, createParents bool) (pub, unpub []time.Duration, pubCPU, unpubCPU time.Duration, err error) {
	vols := s.volumes(n)
	runtime.GC() // the client's own garbage is collected before, not during, the timed calls
	cpu0, err := cpuTime(s.pid)
	if err != nil {
		return
	}
	if pub, err = s.publishAll(vols, createParents); err != nil {
		return
	}
	cpu1, err := cpuTime(s.pid)
	if err != nil {
		return
	}
	if unpub, err = s.unpublishAll(vols); err != nil {
		return
	}
	cpu2, err := cpuTime(s.pid)
	return pub, unpub, cpu1 - cpu0, cpu2 - cpu1, err
}

// check publishes one volume and verifies what a pod would see: the 3 files with their bytes
// and mode, on a tmpfs mounted nosuid,nodev,noexec; then that publish and unpublish are
// idempotent and that unpublish removes the target. Returns the tmpfs size.
func (s *server) check(createParents bool) (uint64, error) {
	v := newVolume(s.root, "check")
	if _, err := s.publishAll([]volume{v}, createParents); err != nil {
		return 0, err
	}
	for _, kv := range warmValues() {
		path := filepath.Join(v.target, kv[0])
		data, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		info, err := os.Stat(path)
		if err != nil {
			return 0, err
		}
		if string(data) != kv[1] || info.Mode().Perm() != fileMode {
			return 0, fmt.Errorf("%s: %s holds %q, mode %o; want %q, mode %o", s.label, path, data, info.Mode().Perm(), kv[1], fileMode)
		}
	}
	// Which layout a pod sees: kubelet's (names linked into `..data`) or plain files.
	layout := "files straight in the tmpfs"
	if info, err := os.Lstat(filepath.Join(v.target, "..data")); err == nil && info.Mode()&os.ModeSymlink != 0 {
		layout = "names linked into ..data (kubelet's atomic layout)"
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(v.target, &fs); err != nil {
		return 0, err
	}
	if fs.Type != tmpfsMagic || fs.Flags&(stNoSUID|stNoDev|stNoExec) != stNoSUID|stNoDev|stNoExec {
		return 0, fmt.Errorf("%s: %s is not a nosuid,nodev,noexec tmpfs (type %#x, flags %#x)", s.label, v.target, fs.Type, fs.Flags)
	}
	size := uint64(fs.Blocks) * uint64(fs.Bsize)
	s.Plugin["layout"] = layout
	if _, err := s.publishAll([]volume{v}, false); err != nil {
		return 0, fmt.Errorf("second publish of the same target: %w", err)
	}
	if _, err := s.unpublishAll([]volume{v}); err != nil {
		return 0, err
	}
	if _, err := os.Lstat(v.target); !os.IsNotExist(err) {
		return 0, fmt.Errorf("%s: %s still exists after unpublish (%v)", s.label, v.target, err)
	}
	if _, err := s.unpublishAll([]volume{v}); err != nil {
		return 0, fmt.Errorf("second unpublish of the same target: %w", err)
	}
	s.Checks = append(s.Checks,
		fmt.Sprintf("3 files of 64 bytes, mode 0444, on a nosuid,nodev,noexec tmpfs of %d bytes", size),
		"publish twice and unpublish twice succeed; unpublish removes the target")
	return size, nil
}

// cpuTime is utime+stime of the process (all its threads) from /proc/<pid>/stat.
func cpuTime(pid int) (time.Duration, error) {
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(text), ')')
	fields := strings.Fields(string(text[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("cannot parse /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cannot parse /proc/%d/stat", pid)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// procStatus reads the kB fields of /proc/<pid>/status that matter here (Threads as a count).
func procStatus(pid int) (map[string]float64, error) {
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	want := map[string]bool{"VmRSS": true, "RssAnon": true, "RssFile": true, "RssShmem": true, "VmHWM": true, "Threads": true}
	out := map[string]float64{}
	for _, line := range strings.Split(string(text), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !want[name] {
			continue
		}
		if f := strings.Fields(rest); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				out[name] = v
			}
		}
	}
	return out, nil
}

// ---------------------------------------------------------------------------------------------
// Statistics.

func sorted(d []time.Duration) []time.Duration {
	v := append([]time.Duration(nil), d...)
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	return v
}

func median(d []time.Duration) time.Duration {
	v := sorted(d)
	n := len(v)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return v[n/2]
	default:
		return (v[n/2-1] + v[n/2]) / 2
	}
}

// p99 is the nearest-rank 99th percentile, as in publish.rs.
func p99(d []time.Duration) time.Duration {
	v := sorted(d)
	if len(v) == 0 {
		return 0
	}
	rank := (len(v)*99 + 99) / 100
	return v[rank-1]
}

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
func us(d time.Duration) float64 { return float64(d) / 1e3 }
func round3(x float64) float64   { return math.Round(x*1000) / 1000 }

// ---------------------------------------------------------------------------------------------
// Machine description.

func firstLine(path, prefix string) string {
	text, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, prefix) {
			if _, v, ok := strings.Cut(line, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown"
}

// filesystemOf is the type of the mount holding dir (longest mount point that contains it).
func filesystemOf(dir string) string {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	text, _ := os.ReadFile("/proc/self/mountinfo")
	best, fstype := -1, "unknown"
	for _, line := range strings.Split(string(text), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 {
			continue
		}
		mp := strings.ReplaceAll(f[4], `\040`, " ")
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > best {
			best, fstype = len(mp), g[0]
		}
	}
	return fstype
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// ---------------------------------------------------------------------------------------------
// The benchmark.

type config struct {
	rounds, perRound, warmup int
	idleWait, readyTimeout   time.Duration
	createParents            bool
	targets, jsonPath        string
	connection               string // "shared" or "per-call"
}

func runBench(cfg config, servers []*server) error {
	started := time.Now().UTC()
	for _, s := range servers {
		if err := s.connect(); err != nil {
			return err
		}
		defer s.conn.Close()
		s.root = filepath.Join(cfg.targets, s.key)
		if err := os.MkdirAll(filepath.Join(s.root, "pods"), 0o750); err != nil {
			return err
		}
	}
	for _, s := range servers {
		if err := s.waitReady(cfg.readyTimeout); err != nil {
			return err
		}
	}
	// Idle: started, ready, then idle-wait, before anything but Probe.
	time.Sleep(cfg.idleWait)
	for _, s := range servers {
		st, err := procStatus(s.pid)
		if err != nil {
			return fmt.Errorf("%s: %w", s.label, err)
		}
		s.Idle = st
	}
	sizes := map[string]uint64{}
	for _, s := range servers {
		if err := s.describe(); err != nil {
			return fmt.Errorf("%s: %w", s.label, err)
		}
		size, err := s.check(cfg.createParents)
		if err != nil {
			return err
		}
		sizes[s.key] = size
	}
	if len(servers) == 2 && sizes["go"] != sizes["lk"] {
		return fmt.Errorf("tmpfs sizes differ: Go plugin %d bytes, latchkey %d bytes", sizes["go"], sizes["lk"])
	}
	// Warm-up: untimed (latchkey's first publish fills its cache; both warm their code paths).
	for _, s := range servers {
		if _, _, _, _, err := s.cycle(cfg.warmup, cfg.createParents); err != nil {
			return err
		}
	}
	// Interleaved rounds: each round runs every server once, the first one alternating.
	for r := 0; r < cfg.rounds; r++ {
		order := append([]*server(nil), servers...)
		if r%2 == 1 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for pos, s := range order {
			pub, unpub, pubCPU, unpubCPU, err := s.cycle(cfg.perRound, cfg.createParents)
			if err != nil {
				return err
			}
			s.pub = append(s.pub, pub...)
			s.unpub = append(s.unpub, unpub...)
			s.pubCPU += pubCPU
			s.unpubCPU += unpubCPU
			probe, err := s.probeAll(cfg.perRound)
			if err != nil {
				return err
			}
			s.probe = append(s.probe, probe...)
			s.rounds = append(s.rounds, roundResult{
				Round: r, Position: pos, PublishMedianMs: round3(ms(median(pub))),
				CPUPerPublishUs: round3(us(pubCPU) / float64(len(pub))),
			})
		}
	}
	for _, s := range servers {
		st, err := procStatus(s.pid)
		if err != nil {
			return fmt.Errorf("%s: %w", s.label, err)
		}
		s.End = st
	}
	finished := time.Now().UTC()
	report := newReport(cfg, servers, started, finished, sizes)
	fmt.Print(report.markdown())
	if cfg.jsonPath != "" {
		data, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(cfg.jsonPath), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(cfg.jsonPath, append(data, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Printf("\nJSON report: %s\n", cfg.jsonPath)
	}
	return nil
}

// ---------------------------------------------------------------------------------------------
// The report.

type serverReport struct {
	Label             string             `json:"label"`
	Plugin            map[string]string  `json:"plugin"`
	Checks            []string           `json:"checks"`
	Publishes         int                `json:"publishes"`
	PublishMedianMs   float64            `json:"publish_median_ms"`
	PublishP99Ms      float64            `json:"publish_p99_ms"`
	PublishMeanMs     float64            `json:"publish_mean_ms"`
	PublishMinMs      float64            `json:"publish_min_ms"`
	ProbeMedianMs     float64            `json:"probe_median_ms"`
	PublishOverProbe  float64            `json:"publish_median_minus_probe_median_ms"`
	UnpublishMedianMs float64            `json:"unpublish_median_ms"`
	UnpublishP99Ms    float64            `json:"unpublish_p99_ms"`
	CPUPerPublishUs   float64            `json:"cpu_per_publish_us"`
	CPUPerUnpublishUs float64            `json:"cpu_per_unpublish_us"`
	IdleStatusKiB     map[string]float64 `json:"idle_status_kib"`
	EndStatusKiB      map[string]float64 `json:"end_status_kib"`
	RoundMedianMinMs  float64            `json:"round_publish_median_min_ms"`
	RoundMedianMaxMs  float64            `json:"round_publish_median_max_ms"`
	Rounds            []roundResult      `json:"rounds"`
}

type report struct {
	Benchmark string                   `json:"benchmark"`
	Started   string                   `json:"started_utc"`
	Finished  string                   `json:"finished_utc"`
	Machine   map[string]string        `json:"machine"`
	Config    map[string]interface{}   `json:"config"`
	Servers   map[string]*serverReport `json:"servers"`
	Ratios    map[string]float64       `json:"ratios_latchkey_over_go,omitempty"`
	order     []string
}

func newReport(cfg config, servers []*server, started, finished time.Time, sizes map[string]uint64) *report {
	r := &report{
		Benchmark: "go-csi side by side",
		Started:   started.Format("2006-01-02 15:04:05 UTC"),
		Finished:  finished.Format("2006-01-02 15:04:05 UTC"),
		Machine: map[string]string{
			"cpu": firstLine("/proc/cpuinfo", "model name"), "cpus": strconv.Itoa(runtime.NumCPU()),
			"kernel": kernel(), "targets": cfg.targets, "targets_fs": filesystemOf(cfg.targets),
			"client_go": runtime.Version(),
		},
		Config: map[string]interface{}{
			"rounds": cfg.rounds, "publishes_per_round": cfg.perRound, "warmup": cfg.warmup,
			"idle_wait_s": cfg.idleWait.Seconds(), "client_creates_parents": cfg.createParents,
			"tmpfs_bytes": sizes, "namespace": namespace, "external_secret": externalSecret,
			"files": warmFiles, "value_bytes": valueBytes, "connection": cfg.connection,
		},
		Servers: map[string]*serverReport{},
	}
	for _, s := range servers {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, rr := range s.rounds {
			lo, hi = math.Min(lo, rr.PublishMedianMs), math.Max(hi, rr.PublishMedianMs)
		}
		n := float64(len(s.pub))
		r.Servers[s.key] = &serverReport{
			Label: s.label, Plugin: s.Plugin, Checks: s.Checks, Publishes: len(s.pub),
			PublishMedianMs: round3(ms(median(s.pub))), PublishP99Ms: round3(ms(p99(s.pub))),
			PublishMeanMs: round3(ms(mean(s.pub))), PublishMinMs: round3(ms(sorted(s.pub)[0])),
			ProbeMedianMs:     round3(ms(median(s.probe))),
			PublishOverProbe:  round3(ms(median(s.pub)) - ms(median(s.probe))),
			UnpublishMedianMs: round3(ms(median(s.unpub))), UnpublishP99Ms: round3(ms(p99(s.unpub))),
			CPUPerPublishUs: round3(us(s.pubCPU) / n), CPUPerUnpublishUs: round3(us(s.unpubCPU) / n),
			IdleStatusKiB: s.Idle, EndStatusKiB: s.End, RoundMedianMinMs: lo, RoundMedianMaxMs: hi,
			Rounds: s.rounds,
		}
		r.order = append(r.order, s.key)
	}
	g, l := r.Servers["go"], r.Servers["lk"]
	if g != nil && l != nil {
		r.Ratios = map[string]float64{}
		// A ratio over zero (a CPU time below one clock tick in a tiny run) is left out.
		ratio := func(key string, a, b float64) {
			if b > 0 {
				r.Ratios[key] = round3(a / b)
			}
		}
		ratio("publish_median", l.PublishMedianMs, g.PublishMedianMs)
		ratio("publish_p99", l.PublishP99Ms, g.PublishP99Ms)
		ratio("probe_median", l.ProbeMedianMs, g.ProbeMedianMs)
		ratio("publish_over_probe", l.PublishOverProbe, g.PublishOverProbe)
		ratio("unpublish_median", l.UnpublishMedianMs, g.UnpublishMedianMs)
		ratio("cpu_per_publish", l.CPUPerPublishUs, g.CPUPerPublishUs)
		ratio("cpu_per_unpublish", l.CPUPerUnpublishUs, g.CPUPerUnpublishUs)
		ratio("idle_vmrss", l.IdleStatusKiB["VmRSS"], g.IdleStatusKiB["VmRSS"])
	}
	return r
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nCSI NodePublishVolume side by side, %s to %s\n", r.Started, r.Finished)
	fmt.Fprintf(&b, "machine: %s, %s CPUs, Linux %s; targets below %s (%s)\n",
		r.Machine["cpu"], r.Machine["cpus"], r.Machine["kernel"], r.Machine["targets"], r.Machine["targets_fs"])
	fmt.Fprintf(&b, "%d rounds x %d publishes per server, first server alternating, after %d untimed; "+
		"client: Go CSI bindings, grpc-go, %s; connection: %s\n\n", r.Config["rounds"], r.Config["publishes_per_round"],
		r.Config["warmup"], r.Machine["client_go"], r.Config["connection"])
	head := "| measurement |"
	rule := "|---|"
	for _, k := range r.order {
		head += " " + r.Servers[k].Label + " |"
		rule += "---|"
	}
	if r.Ratios != nil {
		head += " latchkey / Go |"
		rule += "---|"
	}
	fmt.Fprintln(&b, head)
	fmt.Fprintln(&b, rule)
	row := func(name string, value func(*serverReport) string, ratio string) {
		line := "| " + name + " |"
		for _, k := range r.order {
			line += " " + value(r.Servers[k]) + " |"
		}
		if r.Ratios != nil {
			if v, ok := r.Ratios[ratio]; ok {
				line += fmt.Sprintf(" %.2fx |", v)
			} else {
				line += " |"
			}
		}
		fmt.Fprintln(&b, line)
	}
	msf := func(v float64) string { return fmt.Sprintf("%.3f ms", v) }
	mib := func(kib float64) string { return fmt.Sprintf("%.1f MiB", kib/1024) }
	n := 0
	for _, k := range r.order {
		n = r.Servers[k].Publishes
	}
	row(fmt.Sprintf("publish, median (%d)", n), func(s *serverReport) string { return "**" + msf(s.PublishMedianMs) + "**" }, "publish_median")
	row("publish, p99", func(s *serverReport) string { return msf(s.PublishP99Ms) }, "publish_p99")
	row("publish, mean", func(s *serverReport) string { return msf(s.PublishMeanMs) }, "")
	row("publish, round medians (min-max)", func(s *serverReport) string {
		return fmt.Sprintf("%.3f-%.3f ms", s.RoundMedianMinMs, s.RoundMedianMaxMs)
	}, "")
	row("Probe (the bare gRPC round trip), median", func(s *serverReport) string { return msf(s.ProbeMedianMs) }, "probe_median")
	row("publish median minus Probe median", func(s *serverReport) string { return msf(s.PublishOverProbe) }, "publish_over_probe")
	row("unpublish, median", func(s *serverReport) string { return msf(s.UnpublishMedianMs) }, "unpublish_median")
	row("server CPU per publish (utime+stime)", func(s *serverReport) string { return fmt.Sprintf("%.0f µs", s.CPUPerPublishUs) }, "cpu_per_publish")
	row("server CPU per unpublish", func(s *serverReport) string { return fmt.Sprintf("%.0f µs", s.CPUPerUnpublishUs) }, "cpu_per_unpublish")
	row("idle VmRSS (ready + 1 s, before any publish)", func(s *serverReport) string { return "**" + mib(s.IdleStatusKiB["VmRSS"]) + "**" }, "idle_vmrss")
	row("idle RssAnon / RssFile / RssShmem", func(s *serverReport) string {
		return mib(s.IdleStatusKiB["RssAnon"]) + " / " + mib(s.IdleStatusKiB["RssFile"]) + " / " + mib(s.IdleStatusKiB["RssShmem"])
	}, "")
	row("idle threads", func(s *serverReport) string { return fmt.Sprintf("%.0f", s.IdleStatusKiB["Threads"]) }, "")
	row("VmRSS after the run / VmHWM", func(s *serverReport) string {
		return mib(s.EndStatusKiB["VmRSS"]) + " / " + mib(s.EndStatusKiB["VmHWM"])
	}, "")
	fmt.Fprintln(&b)
	for _, k := range r.order {
		s := r.Servers[k]
		fmt.Fprintf(&b, "%s: %s %s, pid %s; %s\n", s.Label, s.Plugin["name"], s.Plugin["vendor_version"], s.Plugin["pid"], s.Plugin["layout"])
	}
	return b.String()
}

// ---------------------------------------------------------------------------------------------

func main() {
	goSocket := flag.String("go-socket", "", "socket of the minimal Go plugin (empty: not measured)")
	goPid := flag.Int("go-pid", 0, "pid of the minimal Go plugin")
	goLabel := flag.String("go-label", "minimal Go plugin", "the Go plugin's name in the report (say which -layout it runs)")
	lkSocket := flag.String("latchkey-socket", "", "socket of `latchkey node` (empty: not measured)")
	lkPid := flag.Int("latchkey-pid", 0, "pid of `latchkey node`")
	targets := flag.String("targets", "", "scratch directory for target directories (<dir>/go, <dir>/lk)")
	rounds := flag.Int("rounds", 10, "interleaved rounds")
	perRound := flag.Int("per-round", 200, "timed publishes (then unpublishes) per server and round")
	warmup := flag.Int("warmup", 50, "untimed publishes (and unpublishes) per server before the rounds")
	idleWait := flag.Duration("idle-wait", time.Second, "wait after both are ready before taking the idle RSS")
	readyTimeout := flag.Duration("ready-timeout", 30*time.Second, "longest wait for Probe to say ready")
	createParents := flag.Bool("create-parents", true, "create each target's parent before publishing, as kubelet does (false: as publish.rs, the server creates it)")
	jsonPath := flag.String("json", "", "write the report as JSON to this path")
	connection := flag.String("connection", "shared", "shared: every call on one connection per server; per-call: each timed call dials its own, as kubelet does")
	mode := flag.String("mode", "bench", "bench, publish or unpublish")
	count := flag.Int("count", 200, "-mode publish/unpublish: volumes")
	prefix := flag.String("prefix", "strace", "-mode publish/unpublish: pod name prefix")
	writeManifests := flag.String("write-manifests", "", "write the warm scenario's manifests into this directory and exit")
	freePort := flag.Bool("free-port", false, "print a free TCP port on 127.0.0.1 and exit")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("go-csi client: ")

	switch {
	case *freePort:
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		return
	case *writeManifests != "":
		if err := os.MkdirAll(*writeManifests, 0o755); err != nil {
			log.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(*writeManifests, "bench.yaml"), []byte(manifests()), 0o644); err != nil {
			log.Fatal(err)
		}
		return
	}

	var servers []*server
	if *goSocket != "" {
		servers = append(servers, &server{key: "go", label: *goLabel, socket: *goSocket, pid: *goPid})
	}
	if *lkSocket != "" {
		servers = append(servers, &server{key: "lk", label: "latchkey", socket: *lkSocket, pid: *lkPid})
	}
	if len(servers) == 0 {
		log.Fatal("give -go-socket, -latchkey-socket or both")
	}
	for _, s := range servers {
		if s.pid <= 0 {
			log.Fatalf("%s: its pid is needed (-go-pid / -latchkey-pid)", s.label)
		}
	}
	if *targets == "" {
		log.Fatal("-targets is required")
	}
	if *connection != "shared" && *connection != "per-call" {
		log.Fatalf("-connection %q: want shared or per-call", *connection)
	}
	for _, s := range servers {
		s.perCall = *connection == "per-call"
	}
	if *rounds < 1 || *perRound < 1 || *warmup < 0 || *count < 1 {
		log.Fatal("-rounds, -per-round and -count must be at least 1, -warmup at least 0")
	}
	cfg := config{
		rounds: *rounds, perRound: *perRound, warmup: *warmup, idleWait: *idleWait,
		readyTimeout: *readyTimeout, createParents: *createParents, targets: *targets, jsonPath: *jsonPath,
		connection: *connection,
	}
	var err error
	switch *mode {
	case "bench":
		err = runBench(cfg, servers)
	case "publish", "unpublish":
		err = runPhase(cfg, servers, *mode, *count, *prefix)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// runPhase publishes (or unpublishes) <prefix>-0..count-1 on one server, for tracing the server
// over one kind of call only.
func runPhase(cfg config, servers []*server, mode string, count int, prefix string) error {
	if len(servers) != 1 {
		return errors.New("-mode publish/unpublish takes exactly one server")
	}
	s := servers[0]
	if err := s.connect(); err != nil {
		return err
	}
	defer s.conn.Close()
	if err := s.waitReady(cfg.readyTimeout); err != nil {
		return err
	}
	s.root = filepath.Join(cfg.targets, s.key)
	vols := make([]volume, count)
	for i := range vols {
		vols[i] = newVolume(s.root, fmt.Sprintf("%s-%d", prefix, i))
	}
	var times []time.Duration
	var err error
	if mode == "publish" {
		times, err = s.publishAll(vols, cfg.createParents)
	} else {
		times, err = s.unpublishAll(vols)
	}
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d x %s, median %.3f ms\n", s.label, count, mode, ms(median(times)))
	return nil
}
