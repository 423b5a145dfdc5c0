// Command vmrun runs ctld's kernel tests (or any command) as root inside a
// qemu VM booted from the stock Debian kernel, with the build machine's / as
// a read-only root under a tmpfs overlay. It builds the test binaries on the
// host, boots the guest, streams the guest console, brings back each job's
// output and exit status, and prints a per-package summary. It fails if the
// guest dies, hangs, a job fails, or any kernel test skipped.
//
//	vmrun -kernel DIR [-run REGEX] [-timeout 20m] PKG...        test packages
//	vmrun -kernel DIR -cmd 'shell command' [-cmd ...]            commands
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

type config struct {
	kernelDir string
	cacheDir  string
	run       string
	bench     string
	// pkgRun and pkgSkip narrow one package's tests: "PKG=REGEX", PKG
	// an import path or its suffix ("test/e2e"). They let two VMs share
	// the tests of one long package (Makefile test-vm-split).
	pkgRun, pkgSkip multiFlag
	timeout         time.Duration
	jobTime         time.Duration
	memMB           int
	smp             int
	accel           string
	tcgThread       string
	// lockupRetries is how many fresh boots a run gets after the guest
	// kernel locked up (an emulator or guest-kernel hang, not a test result).
	lockupRetries int
	kargs         string
	cmds          multiFlag
	env           multiFlag
	pkgs          []string
	keep          bool
	systemd       string // scenario script: boot systemd as PID 1 (systemd.go)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	var c config
	flag.StringVar(&c.kernelDir, "kernel", os.Getenv("CTLD_VM_KERNEL_DIR"), "unpacked Debian kernel package (from test/vm/setup.sh)")
	flag.StringVar(&c.cacheDir, "cache", envOr("CTLD_VM_CACHE", "/var/cache/ctld-vm"), "cache directory")
	flag.StringVar(&c.run, "run", "", "only tests matching this regexp (go test -run)")
	flag.Var(&c.pkgRun, "pkg-run", "PKG=REGEX: run only these tests of package PKG (import path or suffix; repeatable)")
	flag.Var(&c.pkgSkip, "pkg-skip", "PKG=REGEX: skip these tests of package PKG (go test -skip; repeatable)")
	flag.StringVar(&c.bench, "bench", "", "run benchmarks matching this regexp (go test -bench), tests off")
	flag.DurationVar(&c.timeout, "timeout", 25*time.Minute, "whole VM run limit")
	flag.DurationVar(&c.jobTime, "job-timeout", 15*time.Minute, "limit per test binary or command")
	flag.IntVar(&c.memMB, "mem", 4096, "guest memory in MiB")
	flag.IntVar(&c.smp, "smp", 2, "guest CPUs")
	flag.StringVar(&c.accel, "accel", envOr("CTLD_VM_ACCEL", "auto"), "tcg, kvm, or auto (kvm only if a probe boot succeeds)")
	// Single-threaded TCG by default: guest lockups on both vCPUs were seen
	// only with multi-threaded TCG, whose vCPU threads race with each other
	// for interrupts and the big lock; one thread running both vCPUs in turn
	// has no such race and measured faster here (the demo beside a loaded
	// host: 231 s single vs 268 s multi, same run).
	flag.StringVar(&c.tcgThread, "tcg-thread", envOr("CTLD_VM_TCG_THREAD", "single"), "TCG vCPU threading: single (both vCPUs on one host thread) or multi (a host thread per vCPU)")
	flag.IntVar(&c.lockupRetries, "lockup-retries", 1, "fresh boots after a guest kernel lockup (each one is reported)")
	flag.StringVar(&c.kargs, "kargs", "", "extra guest kernel parameters")
	flag.Var(&c.cmds, "cmd", "shell command to run in the guest (repeatable)")
	flag.Var(&c.env, "env", "K=V exported in the guest (repeatable)")
	flag.BoolVar(&c.keep, "keep", false, "keep the work directory")
	flag.StringVar(&c.systemd, "systemd", "", "boot systemd as PID 1 with ctld installed and run this scenario script")
	flag.Parse()
	c.pkgs = flag.Args()

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := run(ctx, c); err != nil {
		fmt.Fprintf(os.Stderr, "vmrun: %v\n", err)
		os.Exit(1)
	}
}

// cmdBuildArgs is the go command that builds ./cmd/... into out. Tests
// drive ctld's crash and stall points (CTLD_TEST_CRASH_AT), which exist
// only with -tags ctldtest; the systemd scenario tests what ships, so it
// gets the default build.
func cmdBuildArgs(systemd bool, out string) []string {
	args := []string{"build"}
	if !systemd {
		args = append(args, "-tags", "ctldtest")
	}
	return append(args, "-o", out, "./cmd/...")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, c config) error {
	if c.kernelDir == "" {
		return errors.New("no kernel: pass -kernel DIR (test/vm/setup.sh prints it)")
	}
	if len(c.pkgs) == 0 && len(c.cmds) == 0 && c.systemd == "" {
		return errors.New("nothing to run: give packages, -cmd or -systemd")
	}
	if c.systemd != "" && (len(c.pkgs) > 0 || len(c.cmds) > 0) {
		return errors.New("-systemd runs alone: no packages or -cmd with it")
	}
	kver, err := kernelVersion(c.kernelDir)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "ctld-vm-")
	if err != nil {
		return fmt.Errorf("make work dir: %w", err)
	}
	if c.keep {
		fmt.Fprintf(os.Stderr, "vmrun: work dir %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	share := filepath.Join(work, "share")
	if err := os.MkdirAll(filepath.Join(share, "bin"), 0o755); err != nil {
		return err
	}

	var jobs []Job
	if len(c.pkgs) > 0 {
		t0 := time.Now()
		tj, err := buildTests(ctx, c, filepath.Join(share, "bin"))
		if err != nil {
			return err
		}
		jobs = append(jobs, tj...)
		fmt.Printf("vmrun: built %d test binaries in %.1fs\n", len(tj), time.Since(t0).Seconds())
	}
	// End-to-end tests and the demo drive the real binaries: build them on
	// the host (compiling under emulation would take minutes).
	build := exec.CommandContext(ctx, "go", cmdBuildArgs(c.systemd != "", filepath.Join(share, "bin", "cmd")+"/")...)
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build ./cmd/...: %w", err)
	}
	// The guest agent runs inside guest images: static (no cgo), as
	// `make agent` builds it; so does the e2e tests' hostile agent.
	for name, pkg := range map[string]string{"ctl-agent": "./cmd/ctl-agent", "e2e-hostileagent": "./test/e2e/hostileagent"} {
		b := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(share, "bin", "cmd", name), pkg)
		b.Env = append(os.Environ(), "CGO_ENABLED=0")
		b.Stdout, b.Stderr = os.Stdout, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("build %s: %w", pkg, err)
		}
	}
	wd, _ := os.Getwd()
	for _, cmd := range c.cmds {
		jobs = append(jobs, Job{Name: cmd, Dir: wd, Argv: []string{"/bin/sh", "-c", cmd}, Timeout: int(c.jobTime.Seconds())})
	}
	binCmd := binDir + "/cmd"
	if c.systemd != "" {
		binCmd = shareBinDir + "/cmd" // the scenario runs the installed units
	}
	env := append([]string{"CTLD_KERNEL_TESTS=1", "CTLD_IN_VM=1", "CTLD_BIN_DIR=" + binCmd}, c.env...)
	if c.systemd != "" {
		j, err := prepareSystemd(ctx, c, share, wd, env)
		if err != nil {
			return err
		}
		jobs = append(jobs, j)
	} else if len(jobs) == 0 {
		return errors.New("no test binaries: the packages have no tests")
	} else if err := os.WriteFile(filepath.Join(share, "guest.sh"), []byte(guestScript(jobs, env)), 0o755); err != nil {
		return err
	}
	initrd := filepath.Join(work, "initrd.cpio")
	if err := buildInitramfs(ctx, c.kernelDir, kver, filepath.Join(work, "initramfs"), initrd); err != nil {
		return err
	}
	accel := c.accel
	if accel == "auto" {
		accel = probeAccel(ctx, c, kver, initrd)
	}
	fmt.Printf("vmrun: booting kernel %s (accel %s, %d MiB, %d cpus)\n", kver, accelArg(accel, c.tcgThread), c.memMB, c.smp)

	res, lockups, err := bootRetrying(ctx, c.lockupRetries,
		func() (bootResult, error) { return boot(ctx, c, kver, initrd, share, accel) },
		func() error { return resetShare(share) })
	if err != nil {
		return err
	}
	err = report(jobs, share, res)
	for i, l := range lockups {
		fmt.Printf("vmrun: NOTE: boot %d of this run was stopped when the guest kernel locked up (%s); its stacks are above\n", i+1, l)
	}
	return err
}

// bootRetrying boots, and boots a fresh VM again (up to retries times) when
// the guest kernel locked up: that is a hang of the emulator or the guest
// kernel, not a test result. It returns the last boot's result and the
// lockup lines of the boots it stopped.
func bootRetrying(ctx context.Context, retries int, boot func() (bootResult, error), reset func() error) (bootResult, []string, error) {
	var lockups []string
	for attempt := 0; ; attempt++ {
		res, err := boot()
		if err != nil || res.lockup == "" || attempt >= retries || ctx.Err() != nil {
			return res, lockups, err
		}
		lockups = append(lockups, strings.TrimSpace(res.lockup))
		fmt.Printf("vmrun: the guest kernel locked up (stacks above): booting a fresh VM to run every job again (retry %d of %d)\n", attempt+1, retries)
		if err := reset(); err != nil {
			return res, lockups, err
		}
	}
}

// resetShare removes the results of a boot that was stopped, so the next
// boot's results are its own.
func resetShare(share string) error {
	for _, p := range []string{"out", "done", "dmesg.txt"} {
		if err := os.RemoveAll(filepath.Join(share, p)); err != nil {
			return fmt.Errorf("clear results of the stopped boot: %w", err)
		}
	}
	return nil
}

func kernelVersion(kdir string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(kdir, "lib/modules"))
	if err != nil || len(ents) != 1 {
		return "", fmt.Errorf("find kernel version under %s/lib/modules: want one dir (err %v)", kdir, err)
	}
	return ents[0].Name(), nil
}

// buildTests compiles each package's tests with `go test -c`, skipping
// packages without test files.
func buildTests(ctx context.Context, c config, outDir string) ([]Job, error) {
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{len .TestGoFiles}}\t{{len .XTestGoFiles}}"}, c.pkgs...)
	out, err := exec.CommandContext(ctx, "go", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("go list %v: %w", c.pkgs, stderrOf(err))
	}
	var jobs []Job
	for i, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 || (f[2] == "0" && f[3] == "0") {
			continue
		}
		bin := filepath.Join(outDir, fmt.Sprintf("%d-%s.test", i, filepath.Base(f[0])))
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, f[0])
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("build tests of %s: %w", f[0], err)
		}
		// The guest sees the share at /ctld-vm; /tmp there is its own
		// tmpfs. It runs the binary from binDir (guest.go).
		guestBin := binDir + "/" + filepath.Base(bin)
		argv := []string{guestBin, "-test.v", "-test.timeout", c.jobTime.String()}
		if c.bench != "" {
			argv = append(argv, "-test.run", "^$", "-test.bench", c.bench, "-test.benchtime", "1x")
		} else {
			run, skip, err := testFilter(c, f[0])
			if err != nil {
				return nil, err
			}
			if run != "" {
				argv = append(argv, "-test.run", run)
			}
			if skip != "" {
				argv = append(argv, "-test.skip", skip)
			}
		}
		jobs = append(jobs, Job{Name: f[0], Dir: f[1], Argv: argv, IsTest: c.bench == "", IsBench: c.bench != "", Timeout: int(c.jobTime.Seconds()) + 30,
			Stage: shareBinDir + "/" + filepath.Base(bin)})
	}
	return jobs, nil
}

// testFilter is the -test.run and -test.skip of package pkg: -run, unless
// a -pkg-run names pkg (both at once are refused: which would win is not
// obvious), and the -pkg-skip that names pkg.
func testFilter(c config, pkg string) (run, skip string, err error) {
	run = c.run
	for _, kv := range c.pkgRun {
		p, re, ok := strings.Cut(kv, "=")
		if !ok || p == "" || re == "" {
			return "", "", fmt.Errorf("-pkg-run %q: want PKG=REGEX", kv)
		}
		if pkgMatches(pkg, p) {
			if c.run != "" {
				return "", "", fmt.Errorf("-pkg-run %q and -run %q both select tests of %s", kv, c.run, pkg)
			}
			run = re
		}
	}
	for _, kv := range c.pkgSkip {
		p, re, ok := strings.Cut(kv, "=")
		if !ok || p == "" || re == "" {
			return "", "", fmt.Errorf("-pkg-skip %q: want PKG=REGEX", kv)
		}
		if pkgMatches(pkg, p) {
			skip = re
		}
	}
	return run, skip, nil
}

// pkgMatches: p is pkg's import path or a suffix of it at a path boundary.
func pkgMatches(pkg, p string) bool {
	p = strings.TrimPrefix(p, "./")
	return pkg == p || strings.HasSuffix(pkg, "/"+p)
}

func stderrOf(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// buildInitramfs makes a busybox initramfs holding the modules needed to
// reach the host's root.
func buildInitramfs(ctx context.Context, kdir, kver, dir, out string) error {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("find busybox (install busybox-static): %w", err)
	}
	for _, d := range []string{"bin", "proc", "sys", "dev", "modules"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(bb, filepath.Join(dir, "bin/busybox"), 0o755); err != nil {
		return err
	}
	mods := filepath.Join(kdir, "lib/modules", kver, "kernel")
	found := map[string]string{}
	err = filepath.WalkDir(mods, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ko") {
			found[strings.TrimSuffix(d.Name(), ".ko")] = p
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("walk modules: %w", err)
	}
	for _, m := range initModules {
		p, ok := found[m]
		if !ok {
			return fmt.Errorf("module %s not in %s", m, mods)
		}
		if err := copyFile(p, filepath.Join(dir, "modules", m+".ko"), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.order"), []byte(strings.Join(initModules, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "init"), []byte(initScript(kver, kdir)), 0o755); err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "sh", "-c", "find . | cpio -o -H newc --quiet")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, f, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build initramfs: %w", err)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// probeAccel uses KVM only if a probe boot under KVM reaches userspace; the
// verdict is cached per host kernel. On the build machines KVM hangs right
// after decompression, so the answer there is tcg.
func probeAccel(ctx context.Context, c config, kver, initrd string) string {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg"
	}
	uname, _ := exec.Command("uname", "-r").Output()
	cache := filepath.Join(c.cacheDir, "kvm-probe-"+strings.TrimSpace(string(uname)))
	if b, err := os.ReadFile(cache); err == nil {
		return strings.TrimSpace(string(b))
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	args := []string{"-accel", "kvm", "-m", "512", "-nographic", "-monitor", "none", "-no-reboot", "-net", "none",
		"-kernel", filepath.Join(c.kernelDir, "boot", "vmlinuz-"+kver), "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=3 ctldprobe"}
	out, _ := exec.CommandContext(pctx, "qemu-system-x86_64", args...).CombinedOutput()
	verdict := "tcg"
	if strings.Contains(string(out), "CTLD-PROBE-OK") {
		verdict = "kvm"
	}
	_ = os.WriteFile(cache, []byte(verdict+"\n"), 0o644)
	fmt.Printf("vmrun: kvm probe: %s (cached in %s)\n", verdict, cache)
	return verdict
}

type bootResult struct {
	bootTime time.Duration
	kernel   []string // console lines that show kernel trouble
	lockup   string   // the first soft-lockup or RCU-stall line, if any
	exitErr  error
	timedOut bool
}

// troubleRE picks the guest kernel's own failures out of the console. Call
// traces are not themselves failures (a test's intended cgroup OOM kill
// prints one); with loglevel=5 they are shown after the line that matched.
var troubleRE = regexp.MustCompile(`(Oops|BUG:|Kernel panic|general protection fault|blocked for more than|WARNING: CPU|INFO: task|Out of memory: Killed|CTLD-INIT-FAILED)`)

func boot(ctx context.Context, c config, kver, initrd, share, accel string) (bootResult, error) {
	work := filepath.Dir(share)
	// ctld's state dir in the guest is a real disk (a sparse file here), not
	// tmpfs: fsync costs what it costs on a host, and XFS project quotas work.
	disk := filepath.Join(work, "state.img")
	if err := makeSparse(disk, stateDiskBytes); err != nil {
		return bootResult{}, err
	}
	mon := monitor{path: filepath.Join(work, "qemu-monitor.sock")}
	args := []string{
		"-accel", accelArg(accel, c.tcgThread), "-m", strconv.Itoa(c.memMB), "-smp", strconv.Itoa(c.smp),
		"-nographic", "-monitor", "unix:" + mon.path + ",server=on,wait=off", "-no-reboot", "-net", "none",
		"-kernel", filepath.Join(c.kernelDir, "boot", "vmlinuz-"+kver), "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=5 hung_task_timeout_secs=60 softlockup_all_cpu_backtrace=1 sysrq_always_enabled=1 nokaslr " + c.kargs,
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + share + ",mount_tag=ctldvm,security_model=none,multidevs=remap",
		"-drive", "file=" + disk + ",format=raw,if=virtio",
	}
	if accel == "kvm" {
		args = append(args, "-cpu", "host")
	} else {
		args = append(args, "-cpu", "max")
	}
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdin = nil
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var res bootResult
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start qemu: %w", err)
	}
	lockup := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			fmt.Println(line)
			if strings.Contains(line, "CTLD-GUEST-UP") && res.bootTime == 0 {
				res.bootTime = time.Since(start)
				fmt.Printf("vmrun: guest up after %.1fs\n", res.bootTime.Seconds())
			}
			if troubleRE.MatchString(line) {
				res.kernel = append(res.kernel, line)
			}
			if lockupRE.MatchString(line) {
				select {
				case lockup <- line:
				default:
				}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop := func(why string) {
		syms, err := loadSymtab(filepath.Join(c.kernelDir, "boot", "System.map-"+kver))
		if err != nil {
			fmt.Printf("vmrun: %v (vCPU addresses stay unnamed)\n", err)
		}
		dumpGuest(mon, why, 2*time.Second, syms)
		// Let the console drain the guest's backtraces, then stop it.
		time.Sleep(3 * time.Second)
		_ = cmd.Process.Kill()
		<-done
	}
	select {
	case res.exitErr = <-done:
	case line := <-lockup:
		res.lockup = line
		stop(fmt.Sprintf("the guest kernel reports a lockup %.0fs after boot (%s)", time.Since(start).Seconds(), strings.TrimSpace(line)))
	case <-ctx.Done():
		res.timedOut = true
		stop("the run reached its time limit")
	}
	pw.Close()
	wg.Wait()
	fmt.Printf("vmrun: guest ran %.1fs\n", time.Since(start).Seconds())
	return res, nil
}

func accelArg(accel, tcgThread string) string {
	if accel == "tcg" {
		return "tcg,thread=" + tcgThread
	}
	return accel
}

// stateDiskBytes is the size of the guest's state disk; the file is sparse,
// so only what the guest writes takes space on the host.
const stateDiskBytes = 16 << 30

func makeSparse(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create state disk: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("size state disk %s: %w", path, err)
	}
	return nil
}

type pkgCount struct{ pass, fail, skip int }

var resultRE = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): `)

// countResults counts `go test -v` result lines.
func countResults(log string) pkgCount {
	var pc pkgCount
	for _, l := range strings.Split(log, "\n") {
		m := resultRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		switch m[1] {
		case "PASS":
			pc.pass++
		case "FAIL":
			pc.fail++
		case "SKIP":
			pc.skip++
		}
	}
	return pc
}

// benchResultRE is a benchmark's result line (`BenchmarkX-2  1  5 ns/op`).
var benchResultRE = regexp.MustCompile(`^Benchmark\S+\s+\d+\s+\S+ ns/op`)

// benchCount counts a `go test -v -bench` log: benchmarks that reported a
// result, and those that failed or skipped (their --- lines).
func benchCount(log string) (ran int, pc pkgCount) {
	pc = countResults(log)
	for _, l := range strings.Split(log, "\n") {
		if benchResultRE.MatchString(l) {
			ran++
		}
	}
	return ran, pc
}

// benchProblems is why a benchmark job failed although its exit status
// may be 0: like a test that skipped in the VM, a benchmark that skipped
// measured nothing it was asked for. (That no benchmark matched at all is
// checked over the whole run: `make bench` with the default VM_PKGS=./...
// has packages without a matching benchmark.)
func benchProblems(name, log string) []string {
	_, pc := benchCount(log)
	var out []string
	if pc.skip > 0 {
		out = append(out, fmt.Sprintf("%s: %d benchmark(s) skipped in the VM; benchmarks must run", name, pc.skip))
	}
	return out
}

// topLevelRE is a top-level test's result line (not a subtest's) and its
// duration.
var topLevelRE = regexp.MustCompile(`^--- (?:PASS|FAIL|SKIP): (\S+) \(([0-9.]+)s\)`)

// testTime is one top-level test's guest time.
type testTime struct {
	pkg, name string
	secs      float64
}

// testTimes lists the top-level tests of a `go test -v` log of pkg.
func testTimes(pkg, log string) []testTime {
	var out []testTime
	for _, l := range strings.Split(log, "\n") {
		if m := topLevelRE.FindStringSubmatch(l); m != nil {
			secs, _ := strconv.ParseFloat(m[2], 64)
			out = append(out, testTime{pkg: pkg, name: m[1], secs: secs})
		}
	}
	return out
}

// slowest is the n longest of ts, longest first: where a VM run's time goes.
func slowest(ts []testTime, n int) []testTime {
	ts = slices.Clone(ts)
	slices.SortStableFunc(ts, func(a, b testTime) int { return cmp.Compare(b.secs, a.secs) })
	return ts[:min(n, len(ts))]
}

func report(jobs []Job, share string, res bootResult) error {
	var problems []string
	switch {
	case res.lockup != "":
		problems = append(problems, "the guest kernel locked up and was stopped at once (its CPUs' stacks are above): "+
			"a hang of the emulator or the guest kernel, not a test result: "+strings.TrimSpace(res.lockup))
	case res.timedOut:
		problems = append(problems, "the guest hung: killed at the run's time limit (its CPUs' stacks are above)")
	case res.exitErr != nil:
		problems = append(problems, fmt.Sprintf("qemu failed: %v", res.exitErr))
	}
	if _, err := os.Stat(filepath.Join(share, "done")); err != nil && !res.timedOut && res.lockup == "" {
		problems = append(problems, "the guest died before finishing its jobs")
	}
	if b, err := os.ReadFile(filepath.Join(share, "dmesg.txt")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		fmt.Printf("vmrun: guest kernel errors (dmesg -l err+):\n%s", b)
	}
	for _, l := range res.kernel {
		problems = append(problems, "guest kernel: "+l)
	}
	var total pkgCount
	var times []testTime
	var benches, benchRan, benchFailed int
	fmt.Println("vmrun: summary")
	for i, j := range jobs {
		rcb, err := os.ReadFile(filepath.Join(share, "out", strconv.Itoa(i)+".rc"))
		rc := -1
		if err == nil {
			rc, _ = strconv.Atoi(strings.TrimSpace(string(rcb)))
		}
		logb, _ := os.ReadFile(filepath.Join(share, "out", strconv.Itoa(i)+".log"))
		status := "ok  "
		if rc != 0 {
			status = "FAIL"
			why := fmt.Sprintf("exit status %d", rc)
			switch rc {
			case -1:
				why = "no exit status (did not run or did not finish)"
			case 124, 137:
				why = "timed out in the guest"
			}
			problems = append(problems, fmt.Sprintf("%s: %s", j.Name, why))
		}
		if j.IsTest {
			times = append(times, testTimes(j.Name, string(logb))...)
			pc := countResults(string(logb))
			if pc.pass+pc.fail+pc.skip == 0 && rc == 0 {
				problems = append(problems, j.Name+": no test ran (check -run)")
				status = "FAIL"
			}
			if pc.skip > 0 {
				problems = append(problems, fmt.Sprintf("%s: %d test(s) skipped in the VM; kernel tests must run", j.Name, pc.skip))
				status = "FAIL"
			}
			total.pass += pc.pass
			total.fail += pc.fail
			total.skip += pc.skip
			fmt.Printf("  %s %-50s passed %3d  failed %3d  skipped %3d\n", status, j.Name, pc.pass, pc.fail, pc.skip)
		} else if j.IsBench {
			ps := benchProblems(j.Name, string(logb))
			if len(ps) > 0 {
				status = "FAIL"
			}
			problems = append(problems, ps...)
			ran, pc := benchCount(string(logb))
			benches++
			benchRan += ran
			benchFailed += pc.fail
			fmt.Printf("  %s %-50s benchmarks ran %3d  failed %3d  skipped %3d\n", status, j.Name, ran, pc.fail, pc.skip)
		} else {
			fmt.Printf("  %s %s (exit %d)\n", status, j.Name, rc)
		}
	}
	if benches > 0 && benchRan == 0 && benchFailed == 0 {
		problems = append(problems, "no benchmark ran in any package (check -bench and VM_PKGS)")
	}
	if len(times) > 0 {
		fmt.Println("vmrun: slowest tests (guest seconds)")
		for _, tt := range slowest(times, 10) {
			fmt.Printf("  %7.1fs %s %s\n", tt.secs, tt.pkg, tt.name)
		}
	}
	if res.bootTime > 0 {
		fmt.Printf("vmrun: boot to guest userspace %.1fs\n", res.bootTime.Seconds())
	}
	if total.pass+total.fail+total.skip > 0 {
		fmt.Printf("vm: %d passed, %d failed, %d skipped\n", total.pass, total.fail, total.skip)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Printf("vmrun: FAIL: %s\n", p)
		}
		return fmt.Errorf("%d problem(s) in the VM run", len(problems))
	}
	return nil
}
