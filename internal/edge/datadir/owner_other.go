//go:build !unix

package datadir

import "io/fs"

// Owner is not known here: files have no Unix owner, and Check leaves who
// may write them to the system's access lists.
func Owner(fs.FileInfo) (uid int, ok bool) { return 0, false }
