// Command modproxy adds modules of a directory tree to a file-based module
// proxy, laid out as the GOPROXY protocol serves a tagged release
// (https://go.dev/ref/mod#goproxy-protocol): for each module
// $PROXY/<escaped path>/@v/list, VERSION.info, VERSION.mod and VERSION.zip,
// the zip made by golang.org/x/mod/zip as the go command makes it from a
// repository (nested modules, vendor directories and version-control
// directories left out). scripts/release-check serves it with
// GOPROXY=file://$PROXY.
//
// Usage:
//
//	go run ./scripts/modproxy -proxy DIR -version vX.Y.Z MODULE_DIR...
//
// Each MODULE_DIR holds a go.mod; the files it contains are what is zipped, so
// run it on a copy that holds only the repository's files (what a tag would
// carry), not on a working tree with build outputs in it.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	proxy := flag.String("proxy", "", "the proxy's directory (created if missing)")
	version := flag.String("version", "", "the version served, a semantic version such as v0.1.0")
	flag.Parse()
	if *proxy == "" || !semver.IsValid(*version) || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: modproxy -proxy DIR -version vX.Y.Z MODULE_DIR...")
		os.Exit(2)
	}
	for _, dir := range flag.Args() {
		path, err := add(*proxy, *version, dir, time.Now().UTC())
		if err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", dir, err)
			os.Exit(1)
		}
		fmt.Printf("%s@%s\n", path, *version)
	}
}

// add serves the module in dir at version from proxy and returns its path.
func add(proxy, version, dir string, at time.Time) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return "", errors.New("go.mod names no module")
	}
	mv := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return "", err
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	z, err := os.Create(filepath.Join(vdir, version+".zip"))
	if err != nil {
		return "", err
	}
	if err := zip.CreateFromDir(z, mv, dir); err != nil {
		_ = z.Close()
		return "", err
	}
	if err := z.Close(); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".mod"), gomod, 0o644); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, at})
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".info"), info, 0o644); err != nil {
		return "", err
	}
	return path, addToList(filepath.Join(vdir, "list"), version)
}

// addToList adds version to the proxy's list file, one version a line.
func addToList(list, version string) error {
	b, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(b))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
