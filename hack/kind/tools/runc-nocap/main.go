// runc-nocap: runs the real runc after removing CAP_SYS_RESOURCE from the OCI spec it is
// given. On machines where root itself lacks CAP_SYS_RESOURCE (some VMs and sandboxes),
// runc fails with "unable to apply caps" for every privileged container (kind's nodes,
// kube-proxy). Registered as dockerd's default runtime and installed as `runc` in the kind
// node image. It edits <bundle>/config.json for create and run, and the --process file for
// exec; any --cap CAP_SYS_RESOURCE argument of exec is dropped. Everything else passes
// through unchanged.
//
// The real runc is RUNC_NOCAP_REAL, else the first of /usr/sbin/runc, /usr/bin/runc that
// is not this program.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

const dropped = "CAP_SYS_RESOURCE"

func realRunc() string {
	if p := os.Getenv("RUNC_NOCAP_REAL"); p != "" {
		return p
	}
	self, _ := os.Executable()
	self, _ = filepath.EvalSymlinks(self)
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc", "/sbin/runc"} {
		r, err := filepath.EvalSymlinks(p)
		if err == nil && r != self {
			return p
		}
	}
	fmt.Fprintln(os.Stderr, "runc-nocap: no real runc found (set RUNC_NOCAP_REAL)")
	os.Exit(1)
	return ""
}

func capPresent() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "CapBnd:") {
			var bnd uint64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "CapBnd:")), "%x", &bnd)
			return bnd&(1<<24) != 0 // CAP_SYS_RESOURCE is 24
		}
	}
	return false
}

// stripCaps removes CAP_SYS_RESOURCE from every capability set of an OCI process object.
func stripCaps(process map[string]any) {
	caps, ok := process["capabilities"].(map[string]any)
	if !ok {
		return
	}
	for set, v := range caps {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := list[:0]
		for _, c := range list {
			if c != dropped {
				kept = append(kept, c)
			}
		}
		caps[set] = kept
	}
}

func editJSON(path string, process func(doc map[string]any) map[string]any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return err
	}
	if p := process(doc); p != nil {
		stripCaps(p)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, info.Mode().Perm())
}

// Global runc flags that take a value (runc 1.1): the subcommand is the first other word.
var globalWithValue = map[string]bool{
	"--log": true, "--log-format": true, "--root": true, "--criu": true, "--rootless": true,
}

func flagValue(args []string, i int, names ...string) (string, bool) {
	a := args[i]
	for _, n := range names {
		if a == n && i+1 < len(args) {
			return args[i+1], true
		}
		if strings.HasPrefix(a, n+"=") {
			return strings.TrimPrefix(a, n+"="), true
		}
	}
	return "", false
}

func main() {
	args := os.Args[1:]
	real := realRunc()
	if !capPresent() {
		cmd := -1
		for i := 0; i < len(args); i++ {
			a := args[i]
			if !strings.HasPrefix(a, "-") {
				cmd = i
				break
			}
			if globalWithValue[a] {
				i++
			}
		}
		if cmd >= 0 {
			if err := rewrite(args, cmd); err != nil {
				fmt.Fprintln(os.Stderr, "runc-nocap:", err)
				os.Exit(1)
			}
			args = dropCapArgs(args, cmd)
		}
	}
	err := syscall.Exec(real, append([]string{"runc"}, args...), os.Environ())
	fmt.Fprintln(os.Stderr, "runc-nocap: exec", real, err)
	os.Exit(1)
}

func rewrite(args []string, cmd int) error {
	switch args[cmd] {
	case "create", "run":
		bundle := "."
		for i := cmd + 1; i < len(args); i++ {
			if v, ok := flagValue(args, i, "--bundle", "-b"); ok {
				bundle = v
			}
		}
		return editJSON(filepath.Join(bundle, "config.json"), func(doc map[string]any) map[string]any {
			p, _ := doc["process"].(map[string]any)
			return p
		})
	case "exec":
		for i := cmd + 1; i < len(args); i++ {
			if v, ok := flagValue(args, i, "--process", "-p"); ok {
				return editJSON(v, func(doc map[string]any) map[string]any { return doc })
			}
		}
	}
	return nil
}

// dropCapArgs removes `--cap CAP_SYS_RESOURCE` (and `-c`) from an exec command line.
func dropCapArgs(args []string, cmd int) []string {
	if args[cmd] != "exec" {
		return args
	}
	out := append([]string{}, args[:cmd+1]...)
	for i := cmd + 1; i < len(args); i++ {
		if (args[i] == "--cap" || args[i] == "-c") && i+1 < len(args) && args[i+1] == dropped {
			i++
			continue
		}
		if args[i] == "--cap="+dropped {
			continue
		}
		out = append(out, args[i])
	}
	return out
}
