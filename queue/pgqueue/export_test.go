package pgqueue

// MigrationCount returns the number of embedded migrations.
func MigrationCount() int {
	ms, err := loadMigrations()
	if err != nil {
		panic(err)
	}
	return len(ms)
}
