module github.com/streamd/streamd

go 1.26.0

require golang.org/x/sys v0.50.0

require go.uber.org/goleak v1.3.0

require github.com/stretchr/testify v1.12.1 // indirect

require github.com/BurntSushi/toml v1.6.0
