package statuspage

import "io/fs"

// EmbeddedFS is every file embedded for the page, for the check that each
// is served (and so checked).
func EmbeddedFS() fs.FS { return assets }
