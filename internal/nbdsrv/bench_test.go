package nbdsrv_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
	"github.com/ctld/ctld/internal/testutil"
)

// BenchmarkVsQemuNbd compares our server (file backend) with qemu-nbd serving
// the same 1 GiB of data over the same kind of socket (Unix), as ratios
// ours/qemu-nbd from one benchmark run:
//
//	test/nbd/setup.sh --bench
//	go test -run '^$' -bench VsQemuNbd -benchtime 1x ./internal/nbdsrv
//
// nbdcopy sequential read (to null:), fio 4 KiB random reads at iodepth 16,
// and nbdcopy --flush sequential write from a file. qemu-nbd serves the raw
// file and, as the writer will, a qcow2 overlay over it. The base is synced
// and read once through every server first (page cache warm, no writeback
// running, our buffer pools filled): the reads measure the servers, not the
// disk. Each figure is the median of three rounds taken in turn, so load
// from other work on the machine hits every server alike.
func BenchmarkVsQemuNbd(b *testing.B) {
	nbdtest.NeedPeers(b, "nbdcopy", "qemu-nbd", "qemu-img", "nbdinfo", "fio")
	const size = 1 << 30
	const mib = size / (1 << 20)
	const rounds = 3
	dir := b.TempDir()
	base := filepath.Join(dir, "base.img")
	writeRandom(b, base, size)
	overlay := filepath.Join(dir, "overlay.qcow2")
	nbdtest.Peer(b, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, overlay)

	type server struct {
		name, uri string
		cpu       func() time.Duration // the server's CPU time so far
	}
	qr, qrCPU := qemuNbd(b, "-f", "raw", "-r", base)
	qc, qcCPU := qemuNbd(b, "-f", "qcow2", "-r", overlay)
	servers := []server{
		{"ours (raw file)", serveFile(b, base, false).URI, selfCPU(b)},
		{"qemu-nbd raw", qr, qrCPU},
		{"qemu-nbd qcow2 overlay", qc, qcCPU},
	}
	for _, s := range servers {
		nbdtest.Peer(b, "nbdcopy", s.uri, "null:") // warm up
	}
	read := make([][]float64, len(servers))
	iops := make([][]float64, len(servers))
	cpu := make([][]float64, len(servers)) // server CPU ms per GiB read: load on the machine barely moves it
	for range rounds {
		for i, s := range servers {
			c0 := s.cpu()
			read[i] = append(read[i], mib/timed(b, "nbdcopy", s.uri, "null:").Seconds())
			cpu[i] = append(cpu[i], float64((s.cpu() - c0).Milliseconds()))
			iops[i] = append(iops[i], fioIOPS(b, s.uri))
		}
	}
	for i, s := range servers {
		b.Logf("%-22s nbdcopy read %6.0f MiB/s %v using %4.0f ms server CPU/GiB %v, fio randread 4k qd16 %6.0f IOPS %v, %s",
			s.name, median(read[i]), rounded(read[i]), median(cpu[i]), rounded(cpu[i]), median(iops[i]), rounded(iops[i]), multiConn(b, s.uri))
	}

	// Writes, flushed at the end: disk speed counts here, alike for both.
	tOurs := filepath.Join(dir, "t-ours.img")
	sparseFile(b, tOurs, size)
	tQemu := filepath.Join(dir, "t-qemu.img")
	sparseFile(b, tQemu, size)
	qw, _ := qemuNbd(b, "-f", "raw", tQemu)
	wservers := []string{serveFile(b, tOurs, false).URI, qw}
	write := make([][]float64, 2)
	for range rounds {
		for i, u := range wservers {
			write[i] = append(write[i], mib/timed(b, "nbdcopy", "--flush", base, u).Seconds())
		}
	}
	b.Logf("nbdcopy --flush write: ours %.0f MiB/s %v, qemu-nbd raw %.0f MiB/s %v",
		median(write[0]), rounded(write[0]), median(write[1]), rounded(write[1]))

	ratio := func(m [][]float64, i int) float64 { return median(m[0]) / median(m[i]) }
	b.Logf("ratios ours/qemu-nbd: seq read %.2fx (raw) %.2fx (qcow2 overlay); randread IOPS %.2fx (raw) %.2fx (qcow2 overlay); seq write %.2fx (raw); server CPU per GiB read %.2fx (raw) %.2fx (qcow2 overlay)",
		ratio(read, 1), ratio(read, 2), ratio(iops, 1), ratio(iops, 2), ratio(write, 1), ratio(cpu, 1), ratio(cpu, 2))
	b.ReportMetric(ratio(read, 2), "seqread-x-qcow2")
	b.ReportMetric(ratio(iops, 2), "randread-x-qcow2")
	b.ReportMetric(ratio(read, 1), "seqread-x-raw")
	b.ReportMetric(ratio(iops, 1), "randread-x-raw")
	b.ReportMetric(ratio(write, 1), "seqwrite-x-raw")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func rounded(v []float64) []int {
	r := make([]int, len(v))
	for i, x := range v {
		r[i] = int(math.Round(x))
	}
	return r
}

func writeRandom(tb testing.TB, path string, size int64) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var seed [32]byte
	_, _ = rand.Read(seed[:])
	if _, err := io.CopyN(f, mrand.NewChaCha8(seed), size); err != nil {
		tb.Fatal(err)
	}
	if err := f.Sync(); err != nil { // no writeback left to compete with the reads
		tb.Fatal(err)
	}
}

func timed(tb testing.TB, name string, args ...string) time.Duration {
	tb.Helper()
	t0 := time.Now()
	nbdtest.Peer(tb, name, args...)
	return time.Since(t0)
}

// selfCPU returns this process's CPU time (our server runs in it).
func selfCPU(tb testing.TB) func() time.Duration {
	return func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			tb.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
}

// procCPU returns the CPU time of process pid (utime+stime of /proc/pid/stat).
func procCPU(tb testing.TB, pid int) func() time.Duration {
	return func() time.Duration {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			tb.Fatal(err)
		}
		// Fields after the parenthesized command name; utime and stime are
		// fields 14 and 15 of the whole line, in clock ticks (USER_HZ 100).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(ut+st) * 10 * time.Millisecond
	}
}

// qemuNbd starts qemu-nbd on a fresh Unix socket and returns its URI and CPU
// time.
func qemuNbd(tb testing.TB, args ...string) (string, func() time.Duration) {
	tb.Helper()
	sock := filepath.Join(testutil.SocketDir(tb), "q")
	cmd := exec.Command("qemu-nbd", append([]string{"-k", sock, "-t", "-e", "16", "--cache=writeback", "--aio=threads"}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatal("qemu-nbd did not create its socket")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "nbd+unix:///?socket=" + sock, procCPU(tb, cmd.Process.Pid)
}

func fioIOPS(tb testing.TB, uri string) float64 {
	tb.Helper()
	out := nbdtest.Peer(tb, "fio", "--name=randread", "--ioengine=nbd", "--uri="+uri, "--rw=randread", "--bs=4k",
		"--iodepth=16", "--runtime=5", "--time_based", "--output-format=json")
	var v struct {
		Jobs []struct {
			Read struct {
				IOPS float64 `json:"iops"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if i := strings.IndexByte(out, '{'); i >= 0 {
		out = out[i:]
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.Jobs) != 1 {
		tb.Fatalf("fio output: %v\n%s", err, out)
	}
	return v.Jobs[0].Read.IOPS
}

func multiConn(tb testing.TB, uri string) string {
	tb.Helper()
	// nbdinfo --can exits 0 when the flag is set, 2 when not.
	if _, err := nbdtest.PeerErr("nbdinfo", "--can", "multi-conn", uri); err != nil {
		return "no multi-conn"
	}
	return "multi-conn"
}
