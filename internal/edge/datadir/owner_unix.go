//go:build unix

package datadir

import (
	"io/fs"
	"syscall"
)

// Owner is fi's owner, from the stat it came from.
func Owner(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
